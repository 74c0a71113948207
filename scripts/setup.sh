#!/usr/bin/env bash
# Create .venv and install specdec with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests start or call: a real redis-server, and docker-compose to validate the compose file.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; } \
    || echo "warning: could not install ${missing[*]}; the generation works without them, the Redis and compose tests do not" >&2
fi

python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0  # the CPU wheel on our machines; pins before anything pulls CUDA
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
.venv/bin/python -m specdec.engine.cpu.native  # the gguf paths' C kernels for this CPU (seconds; built on first use otherwise)
