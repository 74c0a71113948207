"""A loopback round trip's cost against the idle gap before it: a plain TCP socket pair, and a gRPC bidi stream
read the way `SessionStream` reads it (a reader thread and a queue) or straight from the call ("grpc direct").
The server sleeps `gap` ms before each reply and reports it; the client prints p10/p50/p90 of round trip − gap.
Run: .venv/bin/python docs/bench/zen4_1203_sitting/hop_gap.py (from the repo root; starts its own servers)."""
import queue
import socket
import struct
import subprocess
import sys
import time
from concurrent import futures

GAPS_MS = (0, 1, 3, 10, 30)
ident = lambda b: b  # noqa: E731


def grpc_server(port: int) -> None:
    import grpc

    def handler(requests, context):
        for request in requests:
            began = time.perf_counter()
            time.sleep(float(request.decode()) / 1e3)
            yield struct.pack("d", time.perf_counter() - began)

    server = grpc.server(futures.ThreadPoolExecutor(12))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.T", {"S": grpc.stream_stream_rpc_method_handler(handler, ident, ident)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def socket_server(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(64):
        began = time.perf_counter()
        time.sleep(float(data.decode()) / 1e3)
        conn.sendall(struct.pack("d", time.perf_counter() - began))


def percentiles(samples: list[float]) -> str:
    samples.sort()
    n = len(samples)
    return " ".join(f"p{q} {samples[q * n // 100] * 1e3:.3f}" for q in (10, 50, 90))


def measure(call, gap: str, rounds: int) -> str:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        reply = call(gap.encode())
        samples.append(time.perf_counter() - began - struct.unpack("d", reply)[0])
    return percentiles(samples)


def main() -> None:
    sys.path.insert(0, ".")
    import grpc

    from orchestrator.clients import SessionStream
    from specdec.runtime.server import CHANNEL_OPTIONS

    servers = [subprocess.Popen([sys.executable, __file__, kind, str(port)])
               for kind, port in (("socket", 47140), ("grpc", 47141))]
    time.sleep(3)
    try:
        conn = socket.create_connection(("127.0.0.1", 47140))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        by_socket = lambda b: (conn.sendall(b), conn.recv(8))[1]  # noqa: E731
        channel = grpc.insecure_channel("127.0.0.1:47141", options=CHANNEL_OPTIONS)
        method = channel.stream_stream("/t.T/S", request_serializer=ident, response_deserializer=ident)
        stream = SessionStream(method)
        requests: queue.Queue = queue.Queue()
        replies = method(iter(requests.get, None))
        clients = {"socket": by_socket, "grpc SessionStream": lambda b: stream.call(b, 5)[0],
                   "grpc direct": lambda b: (requests.put(b), next(replies))[1]}
        for gap in GAPS_MS:
            for name, call in clients.items():
                print(f"gap {gap:2d} ms  {name:18s} round trip − gap, ms: "
                      f"{measure(call, str(gap), 2000 if gap == 0 else 200)}", flush=True)
    finally:
        for server in servers:
            server.kill()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        (socket_server if sys.argv[1] == "socket" else grpc_server)(int(sys.argv[2]))
    else:
        main()
