"""Background responses (`background: true`): a Responses API reply generated apart from the request that asked.

The request is answered as soon as the orchestrator has accepted the call (a refused one gets its 4xx as any
request does): with the response `in_progress`, stored, or with `stream` its events as they come. Either way the
generation goes on in this server whatever the client does, and `GET /v1/responses/{id}` reads where it stands:
`completed` (or `incomplete`) when done, stored as any response is, `failed` with the error, or `cancelled`;
`GET /v1/responses/{id}?stream=true&starting_after=N` streams its events after sequence number N, those sent
already and then the rest as they come, from the server that generates it (which keeps the events of its last
`KEPT_RUNS` ended ones too). `POST /v1/responses/{id}/cancel` stops it here if it runs here, then marks it
cancelled in the store, which every HTTP replica reads: the one generating it watches its stored entry every
`WATCH_S` and cancels its call, which frees its caches on every service. Deleting a running response stops it
the same way. A server that stops fails what it was generating.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator

import grpc
from starlette.responses import StreamingResponse

from specdec.http.calls import event_stream, named_sse
from specdec.http.errors import BadRequest, rpc_error
from specdec.http.response_reply import ResponseReply, ResponseStream
from specdec.http.response_store import ACTIVE, ResponseNotFound, StoreUnavailable

log = logging.getLogger(__name__)
WATCH_S = 0.5  # how often a running response reads its stored state, for a cancel or delete from another replica
KEPT_RUNS = 32  # ended background responses whose events this server keeps, for a late `?stream=true`


@dataclass
class Run:
    """One background response's events as its task adds them (an event's sequence number is its index), and
    whether it has ended; followers wait for more."""

    events: list[dict] = field(default_factory=list)
    ended: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, events: list[dict]) -> None:
        self.events += events
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def follow(self, after: int) -> AsyncIterator[dict]:
        """Its events after sequence number `after`, then each one as it is added, until it has ended."""
        at = max(after + 1, 0)
        while True:
            while at < len(self.events):
                yield self.events[at]
                at += 1
            if self.ended:
                return
            await self.changed.wait()


class BackgroundResponses:
    """The background responses this server is generating or generated lately, beside the `store` they live in."""

    def __init__(self, store):
        self.store = store
        self._running: dict[str, tuple[asyncio.Task, object]] = {}  # id -> (its task, its call)
        self._runs: OrderedDict[str, Run] = OrderedDict()  # the running ones and the last KEPT_RUNS ended
        self._stopped: set[str] = set()  # cancelled or deleted by a client: the task stores nothing more

    def __len__(self) -> int:
        return len(self._running)

    async def start(self, call, first, reply: ResponseReply) -> dict:
        """Store `reply`'s response in progress and go on reading `call` (its first message read) apart; the
        response object as stored. The request was checked to be stored (`ResponsesRequest.refuse_unsupported`,
        `create_response`)."""
        body = reply.response("in_progress", [])
        await reply.settle(body)
        self._runs[reply.id] = Run()
        task = asyncio.create_task(self._finish(call, first, reply), name=f"background {reply.id}")
        self._running[reply.id] = (task, call)
        return body

    def events(self, response_id: str, after: int = -1) -> StreamingResponse:
        """A background response's events after sequence number `after` as server-sent events (`Run.follow`)."""
        run = self._runs.get(response_id)
        if run is None:
            raise BadRequest(f"the events of response {response_id!r} are not kept here: only a background response's,"
                             " by the server that generates it, while it runs and for a while after", "stream")
        return event_stream(named_sse(event) async for event in run.follow(after))

    async def cancel(self, response_id: str) -> dict:
        """Cancel a background response: stopped here first if it runs here (so that it stores nothing more),
        then marked cancelled in the store unless it had ended (`Stored.cancel`); its object as it then stands."""
        if not (await asyncio.to_thread(self.store.body, response_id)).get("background"):
            raise BadRequest(f"response {response_id!r} is not a background response: only those can be cancelled",
                             "response_id")
        await self._stop(response_id)
        return await asyncio.to_thread(self.store.cancel, response_id)

    async def delete(self, response_id: str) -> None:
        """Delete a stored response; one that is running here stops first."""
        await self._stop(response_id)
        self._runs.pop(response_id, None)
        await asyncio.to_thread(self.store.delete, response_id)

    async def close(self) -> None:
        """Fail what is still running: the server is stopping."""
        running = [task for task, call in self._running.values()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _stop(self, response_id: str) -> None:
        if response_id in self._running:
            task, call = self._running[response_id]
            self._stopped.add(response_id)
            call.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _finish(self, call, first, reply: ResponseReply) -> None:
        """Read the call to its end as a streamed reply's events, into the response's `Run`; store how it ended."""
        watcher = asyncio.create_task(self._watch(reply.id, call))
        run, events = self._runs[reply.id], ResponseStream(reply)
        failed = None  # the response object to store as failed
        try:
            async for batch in events.batches(call, first):
                if events.final is not None and reply.id not in self._stopped:
                    await reply.settle(events.final)  # stored before a follower hears it is done
                run.add(batch)
        except asyncio.CancelledError:
            failed = self._fail(reply, run, events, "server_error", "the server stopped before the reply was done")
        except grpc.RpcError as exc:
            failed = self._fail(reply, run, events, *rpc_error(exc)[1:])
        except Exception as exc:  # noqa: BLE001 - a bug: the response fails, we get the trace
            log.exception("background response %s", reply.id)
            failed = self._fail(reply, run, events, "server_error", f"internal error: {exc!r}")
        finally:
            watcher.cancel()
            call.cancel()  # a no-op once the call is done
        try:  # still listed as running while it stores: a cancel waits for it, then finds it ended
            if failed is not None and reply.id not in self._stopped:
                await reply.settle(failed)
        finally:
            run.end()
            self._running.pop(reply.id, None)
            self._stopped.discard(reply.id)
            self._runs.move_to_end(reply.id)
            ended = [key for key, kept in self._runs.items() if kept.ended]
            for key in ended[:max(len(ended) - KEPT_RUNS, 0)]:
                del self._runs[key]
        log.info("background response %s ended: %s", reply.id, run.events[-1]["type"] if run.events else "stopped")

    def _fail(self, reply: ResponseReply, run: Run, events: ResponseStream, code: str, message: str) -> dict | None:
        """A reply that could not be done, unless a client stopped it: its failing events added to the run; the
        failed response object, to store after (None if stopped)."""
        if reply.id in self._stopped:
            return None
        failing = events.failed(code, message)
        run.add(failing)
        return failing[-1]["response"]

    async def _watch(self, response_id: str, call) -> None:
        """Cancel the call once the stored response is cancelled or gone (by a request to another replica)."""
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                status = (await asyncio.to_thread(self.store.body, response_id))["status"]
            except StoreUnavailable:
                continue
            except ResponseNotFound:
                status = "deleted"
            if status not in ACTIVE:
                self._stopped.add(response_id)
                call.cancel()
                return
