#include <immintrin.h>
#include <stdio.h>
#include <omp.h>
static double run(int threads) {
    double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads)
    {
        __m256i a[8], b = _mm256_set1_epi8(3), c = _mm256_set1_epi8(5);
        for (int k = 0; k < 8; k++) a[k] = _mm256_set1_epi16(k);
        for (long i = 0; i < 200000000L / 8; i++) {
            for (int k = 0; k < 8; k++) a[k] = _mm256_add_epi16(a[k], _mm256_maddubs_epi16(b, c));
            __asm__("" : "+x"(b), "+x"(c));
        }
        __m256i s = a[0]; for (int k = 1; k < 8; k++) s = _mm256_add_epi16(s, a[k]);
        volatile int sink = _mm256_extract_epi16(s, 0); (void)sink;
    }
    return omp_get_wtime() - t0;
}
int main() { for (int r = 0; r < 3; r++) { double t1 = run(1), t2 = run(2); printf("1 thread %.3f s, 2 threads %.3f s (per-thread work equal): ratio %.2f\n", t1, t2, t2 / t1); } }
