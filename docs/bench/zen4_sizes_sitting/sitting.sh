#!/bin/bash
# interleaved: llama-server, ours, llama-server, ours, llama-server, ours, llama-server (the target priced per pass size)
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
