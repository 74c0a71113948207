/* Zen 4 pipe microbenchmark (docs/PERFORMANCE.md, "Two weight rows, one activation load"): which 512-bit
 * instructions share vpdpbusd's pipes. gcc -O3 -funroll-all-loops -march=x86-64-v4 -mavx512vnni zen4_pipes.c && ./a.out
 * (cycles assume 3.5 GHz). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 20000000L
int8_t buf[8192] __attribute__((aligned(64)));
#define BENCH(name, body) { double t=now(); for(long n=0;n<N;n++){ body; __asm__ volatile("":"+r"(p)); } double dt=now()-t; printf("%-22s %.2f cycles/iter (at 3.5 GHz)\n", name, dt/N*3.5e9); }
int main(){
  const int8_t *p = buf;
  __m512i a[10]; for(int i=0;i<10;i++) a[i]=_mm512_set1_epi32(i);
  __m512i w=_mm512_set1_epi8(1), x=_mm512_set1_epi8(2);
  __m512 f[6]; for(int i=0;i<6;i++) f[i]=_mm512_set1_ps(1.0f+i*1e-7f);
  __m512 m=_mm512_set1_ps(1.0000001f);
  __m512i ii[6]; for(int i=0;i<6;i++) ii[i]=_mm512_set1_epi32(i);
  BENCH("10 dp reg", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x))
  BENCH("10 dp mem", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,_mm512_load_si512(p+64*(i%5))))
  BENCH("10 dp + 6 cvt", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) f[i]=_mm512_add_ps(f[i],_mm512_cvtepi32_ps(a[i])))
  BENCH("6 cvt+add", for(int i=0;i<6;i++) f[i]=_mm512_add_ps(f[i],_mm512_cvtepi32_ps(ii[i])); __asm__ volatile("":"+v"(ii[0])))
  BENCH("10 dp + 6 sub", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) f[i]=_mm512_sub_ps(f[i],m))
  BENCH("10 dp + 6 mul", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) f[i]=_mm512_mul_ps(f[i],m))
  BENCH("10 dp + 6 srl", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) ii[i]=_mm512_srli_epi64(ii[i],1))
  BENCH("10 dp + 6 perm", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) f[i]=_mm512_permutexvar_ps(ii[i],f[i]))
  BENCH("10 dp + 6 madd16", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) ii[i]=_mm512_madd_epi16(ii[i],x))
  BENCH("10 dp + 6 mullo32", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) ii[i]=_mm512_mullo_epi32(ii[i],x))
  BENCH("10 dp + 6 dpwssd", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) ii[i]=_mm512_dpwssd_epi32(ii[i],x,w))
  BENCH("10 dp + 6 addepi32", for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); for(int i=0;i<6;i++) ii[i]=_mm512_add_epi32(ii[i],x))
  int s=0; for(int i=0;i<10;i++) s+=_mm512_reduce_add_epi32(a[i]); for(int i=0;i<6;i++) s+=_mm512_reduce_add_epi32(ii[i]); float g=0; for(int i=0;i<6;i++) g+=_mm512_reduce_add_ps(f[i]); printf("%d %f\n",s,g);
}
