#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(){ __m512i a[10]; for(int i=0;i<10;i++) a[i]=_mm512_set1_epi32(i); __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
 struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 for(long r=0;r<300000000;r++){ for(int i=0;i<10;i++) a[i]=_mm512_dpbusd_epi32(a[i],w,x); __asm__(""::"v"(a[0]),"v"(a[1]),"v"(a[2]),"v"(a[3]),"v"(a[4]),"v"(a[5]),"v"(a[6]),"v"(a[7]),"v"(a[8]),"v"(a[9]));}
 clock_gettime(CLOCK_MONOTONIC,&t1); int s=0; for(int i=0;i<10;i++) s+=_mm512_reduce_add_epi32(a[i]);
 printf("%.3f s (%d)\n",(t1.tv_sec-t0.tv_sec)+1e-9*(t1.tv_nsec-t0.tv_nsec),s); }
