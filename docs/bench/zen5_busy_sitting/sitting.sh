#!/bin/bash
# interleaved: llama-server, ours, llama-server, ours, llama-server, ours, llama-server (Zen 5: the busy time, the draft limit)
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
