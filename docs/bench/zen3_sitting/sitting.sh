#!/bin/bash
# Zen 3 (AMD EPYC family 25 model 1, AVX2 native, no AVX-512, no VNNI), 2026-12-04: the first sitting on this
# class. llama-server's native build and ours interleaved; then both S-curves and 8 users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
full_sitting
