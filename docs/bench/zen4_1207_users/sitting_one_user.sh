#!/bin/bash
# One user at AVX-512 VNNI against llama-server's native build, in one process: eight alternating repeats of the 4
# prompts (each twice), 64 tokens, greedy; the issue's "adaptive over llama-server's target-only" measured by
# `bench --concurrency 1 --peers` instead of a shell interleaving two programs.
cd "$(dirname "$0")" && source ../sitting_lib.sh
with_peer one_user 1 8 $BIN -c 2048 -np 1
