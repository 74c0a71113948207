// Times q8_matmul of several .so builds on weights that stay in L2: TSC cycles per unit and row, alternating builds,
// and checks their outputs are the same bits. Random Q4_K (type 12) or Q6_K (14) rows, repacked by the first build.
// gcc -O2 -o micro micro.c -ldl -fopenmp -lm; ./micro A.so,B.so TYPE N K THREADS [ONE_ROW_PAIRS]
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
typedef int (*repack_fn)(int, const uint8_t *, int64_t, int64_t, uint8_t *);
typedef void (*quant_fn)(const float *, int64_t, int64_t, void *);
typedef int (*matmul_fn)(int, const uint8_t *, int64_t, int64_t, const void *, int64_t, float *, int64_t, const float *, int);
typedef int64_t (*bytes_fn)(int, int64_t);
typedef int64_t (*actb_fn)(int64_t);
typedef int (*onerow_fn)(int);
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    char *libs[8]; int L = 0;
    for (char *t = strtok(argv[1], ","); t; t = strtok(0, ",")) libs[L++] = t;
    int type = atoi(argv[2]); int64_t N = atol(argv[3]), K = atol(argv[4]); int threads = atoi(argv[5]);
    int pairs = argc > 6 ? atoi(argv[6]) : 1;
    matmul_fn mm[8];
    void *h0 = 0;
    for (int l = 0; l < L; l++) {
        void *h = dlopen(libs[l], RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        if (!l) h0 = h;
        mm[l] = dlsym(h, "q8_matmul"); ((onerow_fn)dlsym(h, "q8_set_one_row_pairs"))(pairs);
    }
    repack_fn repack = dlsym(h0, "q8_repack"); quant_fn quant = dlsym(h0, "q8_quantize");
    bytes_fn rb = dlsym(h0, "q8_row_bytes"); actb_fn ab = dlsym(h0, "q8_act_bytes");
    int bb = type == 12 ? 144 : type == 14 ? 210 : 0, bw = 256;
    int64_t in_row = K / bw * bb; uint8_t *raw = malloc(N * in_row);
    srand(1);
    for (int64_t i = 0; i < N * in_row; i++) raw[i] = rand();
    for (int64_t n = 0; n < N; n++) for (int64_t b = 0; b < K / bw; b++) {
        uint8_t *blk = raw + n * in_row + b * bb;
        uint16_t d = 0x1c00 + (rand() & 0xff);
        if (type == 12) { memcpy(blk, &d, 2); memcpy(blk + 2, &d, 2); }
        else memcpy(blk + 208, &d, 2);
    }
    uint8_t *w = aligned_alloc(64, (N * rb(type, K) + 63) / 64 * 64);
    if (repack(type, raw, N, K, w)) { fprintf(stderr, "repack\n"); return 1; }
    float *x = malloc(16 * K * 4); for (int64_t i = 0; i < 16 * K; i++) x[i] = (rand() / (float)RAND_MAX) - 0.5f;
    void *act = aligned_alloc(64, 16 * ab(K)); quant(x, 16, K, act);
    float *y = malloc(16 * N * 4), *y0 = malloc(16 * N * 4);
    int64_t units = N * ((K + 255) / 256);
    int sizes[] = {1, 2, 3, 4, 5, 6, 8, 9, 12, 16}; int NS = 10;
    enum { REPS = 15 };
    for (int si = 0; si < NS; si++) {
        int S = sizes[si]; double t[8][REPS];
        for (int rep = 0; rep < REPS; rep++)
            for (int l = 0; l < L; l++) {
                uint64_t t0 = __rdtsc();
                for (int it = 0; it < 10; it++) mm[l](type, w, N, K, act, S, y, N, 0, threads);
                t[l][rep] = (double)(__rdtsc() - t0) / 10 * threads / units;
                if (l == 0) memcpy(y0, y, S * N * 4);
                else if (memcmp(y0, y, S * N * 4)) { printf("DIFFERENT BITS lib %d S=%d\n", l, S); }
            }
        printf("S=%2d", S);
        double m0 = 0;
        for (int l = 0; l < L; l++) {
            qsort(t[l], REPS, sizeof(double), cmp);
            double med = t[l][REPS / 2];
            if (!l) m0 = med;
            printf("  | %7.2f /unit %6.2f /unit-row", med, med / S);
            if (l) printf(" (%.3f)", med / m0);
        }
        printf("\n");
    }
    return 0;
}
