/* AVX2 instructions per cycle on this core: 12 independent chains of one instruction, against the clock read
 * from a chain of dependent scalar adds (one a cycle). gcc -O2 -mavx2 port_rates.c -o port_rates && ./port_rates */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define KEEP __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), \
                              "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11))
#define TWELVE(OP) a0 = OP(a0, x); a1 = OP(a1, x); a2 = OP(a2, x); a3 = OP(a3, x); a4 = OP(a4, x); a5 = OP(a5, x); \
    a6 = OP(a6, x); a7 = OP(a7, x); a8 = OP(a8, x); a9 = OP(a9, x); a10 = OP(a10, x); a11 = OP(a11, x)
#define RATE(NAME, OP) do { \
        __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3), a3 = _mm256_set1_epi8(4), \
                a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8), \
                a8 = _mm256_set1_epi8(9), a9 = _mm256_set1_epi8(10), a10 = _mm256_set1_epi8(11), a11 = _mm256_set1_epi8(12); \
        __m256i x = _mm256_set1_epi8(3); \
        __asm__ volatile("" : "+x"(x)); \
        const long n = 100000000; \
        double t = now(); \
        for (long i = 0; i < n; i++) { TWELVE(OP); KEEP; } \
        t = now() - t; \
        printf("%-20s %.2f a cycle\n", NAME, 12.0 * n / (t * hz)); \
    } while (0)

int main(void) {
    long x = 0, n = 1000000000;
    double t = now();
    for (long i = 0; i < n; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double hz = 4.0 * n / (now() - t);
    printf("clock %.2f GHz\n", hz / 1e9);
    RATE("vpmaddubsw", _mm256_maddubs_epi16);
    RATE("vpmaddwd", _mm256_madd_epi16);
    RATE("vpaddw", _mm256_add_epi16);
    RATE("vpshufb", _mm256_shuffle_epi8);
    return (int)(x & 1);
}
