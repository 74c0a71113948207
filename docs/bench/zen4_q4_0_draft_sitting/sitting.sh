#!/bin/bash
# interleaved: llama-server, ours (draft in Q4_0), ours (draft as shipped), ... , llama-server
cd "$(dirname "$0")" && source ../sitting_lib.sh
date
llama 1; ours q4_0_1 q4_0; ours shipped_1 as-shipped; llama 2; ours q4_0_2 q4_0; ours shipped_2 as-shipped; llama 3; ours q4_0_3 q4_0; llama 4
date
