#!/bin/bash
# The same Q3_K_M file capped at AVX2 (SPECDEC_CPU_ISA=avx2): ours before (022db66 in $OLD) and after, twice, alternating.
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q3=${Q3:-/tmp/q3model}; OLD=${OLD:-/tmp/wt_old}
MODEL=$Q3 ISA=avx2 PREFIX=avx2
date
ours_at before1 $OLD; ours_at after1 ""; ours_at before2 $OLD; ours_at after2 ""
date
