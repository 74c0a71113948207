"""python -m specdec.runtime.healthcheck HOST:PORT [--service NAME]: exit 0 if the service is SERVING.

The container health check of the compose file (Kubernetes uses its native gRPC probe).
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.runtime.healthcheck")
    parser.add_argument("address", help="HOST:PORT of a specdec server")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    try:
        with grpc.insecure_channel(args.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout).status
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name}", file=sys.stderr)
        return 1
    print(f"{args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")
    return 0 if status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
