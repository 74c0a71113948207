#!/usr/bin/env bash
# The wheels a GPU host that downloads nothing lacks (../shared/GPU.md), fetched here into .whl/ (git-ignored,
# about 35 MB) for Python 3.12 on x86-64 Linux. The host keeps its own torch. scripts/gpu_check.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=".venv/bin/pip"
fetch() { "$pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_31_x86_64 --platform any -d .whl "$@"; }
fetch gguf==0.19.0 grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 grpcio-tools==1.85.1 \
    protobuf==7.36.2 googleapis-common-protos==1.76.0 \
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
    opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
    opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-prometheus==0.66b2 \
    opentelemetry-semantic-conventions==0.66b2 \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    starlette==1.10.0 uvicorn==0.54.0 redis==8.1.0 \
    openai==3.51.0 jiter==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 sniffio==1.3.1 \
    transformers==5.23.0 huggingface_hub==2.4.0 importlib_resources==7.1.0 typing_extensions==4.16.0 \
    click==8.5.1 anyio==4.16.0 idna==3.20 h11==0.16.0 pytest-timeout==2.4.0
fetch --abi abi3 llguidance==1.9.1  # structured output; its wheel is abi3
"$pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: --platform manylinux_2_5_x86_64 \
    -d .whl py-spy==0.4.3  # scripts/host_profile.py; a binary, any Python
du -sh .whl
