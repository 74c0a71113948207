#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-03, after 94c285a (a pair's activation chunk in one
# register, chunk by chunk at 3-5 rows, pairs up to 10 rows). llama-server's native build and ours interleaved;
# then both S-curves and 8 users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
full_sitting
