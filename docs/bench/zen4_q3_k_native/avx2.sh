#!/bin/bash
# The Q3_K_M file capped at AVX2 (SPECDEC_CPU_ISA=avx2), ours only, two builds alternating twice: `avx2.sh` 022db66
# (Q3_K carried as Q6_K blocks; a checkout in $OLD) against this checkout (avx2.log); `avx2.sh layout` 8d499fa (Q3_K's
# third bits as Q5's 64-bit words; a checkout in $PLANE) against 8f21b3e and after (bit c of each byte; avx2_layout.log).
cd "$(dirname "$0")" && source ../sitting_lib.sh
MODEL=${Q3:-/tmp/q3model} ISA=avx2 PREFIX=avx2
if [ "$1" = layout ]; then a=plane b=slice A=${PLANE:-/tmp/wt_plane}; else a=before b=after A=${OLD:-/tmp/wt_old}; fi
date
ours_at ${a}1 $A; ours_at ${b}1 ""; ours_at ${a}2 $A; ours_at ${b}2 ""
date
