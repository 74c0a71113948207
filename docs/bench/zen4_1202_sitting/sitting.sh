#!/bin/bash
# Zen 4 (AMD EPYC family 25 model 17, AVX-512 VNNI), 2026-12-02: the first Zen 4 sitting since the controller
# changes made on the Zen 5 and Zen 1 classes. llama-server's native build and ours interleaved; then both S-curves
# and 8 users.
cd "$(dirname "$0")" && source ../sitting_lib.sh
full_sitting
