"""The floor gRPC in Python sets under lockstep passes: N bidi streams against a service whose passes
take a fixed time, with nothing else in either process.

The service runs one worker thread that waits for a step from every stream, sleeps `--pass-ms` (a pass
that holds no GIL, as a CUDA graph's wait does not) and releases them; each stream then answers and
sends its next step. With `--server sync` the handler threads block on an event per step (today's
services); with `aio` one event loop serves every stream and the worker completes their futures with one
call per pass. `--client sync` is the orchestrator's `SessionStream` (a thread per stream); `aio` is one
event loop for all. Prints steps/s against the ideal N / pass:

    python scripts/grpc_floor.py --server aio --client aio --streams 8 --pass-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc


class Passes:
    """One worker: waits until `streams` steps are pending, sleeps a pass, hands the batch to `release`."""

    def __init__(self, streams: int, pass_s: float, release):
        self.streams, self.pass_s, self.release = streams, pass_s, release
        self.cond, self.pending = threading.Condition(), []
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, waiter) -> None:
        with self.cond:
            self.pending.append(waiter)
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while len(self.pending) < self.streams:
                    self.cond.wait()
                batch, self.pending = self.pending, []
            time.sleep(self.pass_s)
            self.release(batch)


def answer(request: pb.VerifyRequest) -> pb.VerifyResult:
    return pb.VerifyResult(tokens=[request.commit.start + 1], compute_ns=1)


def serve(kind: str, streams: int, pass_s: float) -> None:
    """Serve on a free loopback port; print it; run until killed."""
    if kind == "sync":
        passes = Passes(streams, pass_s, lambda batch: [event.set() for event in batch])

        class Sync(pb_grpc.TargetServiceServicer):
            def Session(self, requests, context):
                for request in requests:
                    event = threading.Event()
                    passes.submit(event)
                    event.wait()
                    yield answer(request)

        server = grpc.server(futures.ThreadPoolExecutor(streams + 4))
        pb_grpc.add_TargetServiceServicer_to_server(Sync(), server)
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        loop = asyncio.get_running_loop()
        complete = lambda batch: [future.set_result(None) for future in batch]  # noqa: E731
        passes = Passes(streams, pass_s, lambda batch: loop.call_soon_threadsafe(complete, batch))

        class Aio(pb_grpc.TargetServiceServicer):
            async def Session(self, requests, context):
                async for request in requests:
                    future = loop.create_future()
                    passes.submit(future)
                    await future
                    yield answer(request)

        server = grpc.aio.server()
        pb_grpc.add_TargetServiceServicer_to_server(Aio(), server)
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def sync_clients(address: str, streams: int, rounds: int) -> None:
    from orchestrator.clients import target_client

    client = target_client(address)

    def user(i: int) -> None:
        stream = client.open_stream()
        for k in range(rounds):
            stream.call(pb.VerifyRequest(session_id=str(i), commit=pb.Commit(start=k)), 10)
        stream.close()

    threads = [threading.Thread(target=user, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def aio_clients(address: str, streams: int, rounds: int) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.TargetServiceStub(channel)

            async def user(i: int) -> None:
                call = stub.Session()
                for k in range(rounds):
                    await call.write(pb.VerifyRequest(session_id=str(i), commit=pb.Commit(start=k)))
                    await call.read()
                await call.done_writing()

            await asyncio.gather(*(user(i) for i in range(streams)))

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("sync", "aio"), default="sync")
    parser.add_argument("--client", choices=("sync", "aio"), default="sync")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--pass-ms", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.server, args.streams, args.pass_ms / 1e3)
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--server", args.server, "--streams",
                               str(args.streams), "--pass-ms", str(args.pass_ms)], stdout=subprocess.PIPE, text=True)
    try:
        address = f"127.0.0.1:{int(server.stdout.readline())}"
        grpc.channel_ready_future(grpc.insecure_channel(address)).result(timeout=30)
        began = time.perf_counter()
        (sync_clients if args.client == "sync" else aio_clients)(address, args.streams, args.rounds)
        rate = args.streams * args.rounds / (time.perf_counter() - began)
    finally:
        server.kill()
    ideal = args.streams / (args.pass_ms / 1e3)
    print(f"{args.client} client, {args.server} server, {args.streams} streams, {args.pass_ms:g} ms passes: "
          f"{rate:.0f} steps/s ({rate / ideal:.2f} of the ideal {ideal:.0f})")


if __name__ == "__main__":
    main()
