#!/bin/bash
# interleaved: llama-server, ours, llama-server, ours, llama-server, ours, llama-server (draft in Q4_0, the default)
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
