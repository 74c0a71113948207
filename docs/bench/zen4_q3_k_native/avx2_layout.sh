#!/bin/bash
# The Q3_K_M file capped at AVX2: 8d499fa (third bits as Q5's 64-bit words; a checkout in $PLANE) against 8f21b3e
# (bit c of each byte), alternating twice.
cd "$(dirname "$0")" && source ../sitting_lib.sh
Q3=${Q3:-/tmp/q3model}; PLANE=${PLANE:-/tmp/wt_plane}
MODEL=$Q3 ISA=avx2 PREFIX=avx2
date
ours_at plane1 $PLANE; ours_at slice1 ""; ours_at plane2 $PLANE; ours_at slice2 ""
date
