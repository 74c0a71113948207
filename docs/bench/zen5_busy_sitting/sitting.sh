#!/bin/bash
# interleaved: llama-server, ours, llama-server, ours, llama-server, ours, llama-server (Zen 5: the busy time, the draft limit)
cd "$(dirname "$0")" && source ../sitting_lib.sh
date
llama 1; ours 1; llama 2; ours 2; llama 3; ours 3; llama 4
date
