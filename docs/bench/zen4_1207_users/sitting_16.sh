#!/bin/bash
# 16 users at once against llama-server with 16 slots (-np 16 -c 8192: 512 positions each), AVX-512 VNNI, two
# alternating repeats; the same 4 prompts, each taken by four users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
with_peer users_16 16 2 $BIN -c 8192 -np 16
