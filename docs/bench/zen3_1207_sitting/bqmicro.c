// bq_matmul of several blockquant builds on raw Q4_K / Q6_K rows in L2, alternating: TSC cycles per super-block and row.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
typedef int (*bq_fn)(int, const uint8_t *, int64_t, int64_t, const float *, int64_t, float *, int64_t, int);
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    char *libs[8]; int L = 0;
    for (char *t = strtok(argv[1], ","); t; t = strtok(0, ",")) libs[L++] = t;
    int type = atoi(argv[2]); int64_t N = atol(argv[3]), K = atol(argv[4]); int threads = atoi(argv[5]);
    bq_fn mm[8];
    for (int l = 0; l < L; l++) { void *h = dlopen(libs[l], RTLD_NOW | RTLD_LOCAL); if (!h) { puts(dlerror()); return 1; } mm[l] = dlsym(h, "bq_matmul"); }
    int bb = type == 12 ? 144 : 210;
    int64_t in_row = K / 256 * bb; uint8_t *w = malloc(N * in_row);
    srand(1);
    for (int64_t i = 0; i < N * in_row; i++) w[i] = rand();
    for (int64_t n = 0; n < N; n++) for (int64_t b = 0; b < K / 256; b++) {
        uint8_t *blk = w + n * in_row + b * bb; uint16_t d = 0x1c00 + (rand() & 0xff);
        if (type == 12) { memcpy(blk, &d, 2); memcpy(blk + 2, &d, 2); } else memcpy(blk + 208, &d, 2);
    }
    float *x = malloc(16 * K * 4); for (int64_t i = 0; i < 16 * K; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    float *y = malloc(16 * N * 4), *y0 = malloc(16 * N * 4);
    int64_t sbs = N * (K / 256);
    int sizes[] = {1, 2, 3, 5, 8, 9}; enum { REPS = 11 };
    for (int si = 0; si < 6; si++) {
        int S = sizes[si]; double t[8][REPS];
        for (int rep = 0; rep < REPS; rep++) for (int l = 0; l < L; l++) {
            uint64_t t0 = __rdtsc();
            for (int it = 0; it < 4; it++) mm[l](type, w, N, K, x, S, y, N, threads);
            t[l][rep] = (double)(__rdtsc() - t0) / 4 * threads / sbs;
            if (!l) memcpy(y0, y, S * N * 4); else if (memcmp(y0, y, S * N * 4)) printf("DIFFERENT BITS\n");
        }
        printf("S=%d", S); double m0 = 0;
        for (int l = 0; l < L; l++) { qsort(t[l], REPS, sizeof(double), cmp); double m = t[l][REPS / 2]; if (!l) m0 = m;
            printf("  | %8.1f /sb-row", m / S); if (l) printf(" (%.3f)", m / m0); }
        printf("\n");
    }
}
