#!/bin/bash
# interleaved: llama-server, ours, llama-server, ours, llama-server, ours, llama-server (the target priced per pass size, the profile timed off the initial thread)
cd "$(dirname "$0")" && source ../sitting_lib.sh
interleave
