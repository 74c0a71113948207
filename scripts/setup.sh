#!/usr/bin/env bash
# Create .venv and install specdec with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0  # the CPU wheel on our machines; pins before anything pulls CUDA
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
