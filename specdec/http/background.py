"""Background responses (`background: true`): a Responses API reply generated apart from the request that asked.

The request returns as soon as the orchestrator has accepted the call (a refused one gets its 4xx as any
request does) with the response `in_progress`, stored; the generation goes on in this server, and
`GET /v1/responses/{id}` reads where it stands: `completed` (or `incomplete`) when done, stored as any response
is, `failed` with the error, or `cancelled`. `POST /v1/responses/{id}/cancel` stores it cancelled, which every
HTTP replica sharing the store reads: the one generating it cancels its call at once when it is local, and
otherwise within `WATCH_S` (each running response watches its stored entry), which frees its caches on every
service. Deleting a running response cancels it the same way. A server that stops fails what it was generating.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from specdec.http.calls import whole_reply
from specdec.http.errors import BadRequest
from specdec.http.response_reply import ResponseReply
from specdec.http.response_store import ACTIVE, ResponseNotFound, StoreUnavailable

log = logging.getLogger(__name__)
WATCH_S = 0.5  # how often a running response reads its stored state, for a cancel or delete from another replica


class BackgroundResponses:
    """The background responses this server is generating, by id, beside the `store` that they live in."""

    def __init__(self, store):
        self.store = store
        self._running: dict[str, tuple[asyncio.Task, object]] = {}  # id -> (its task, its call)
        self._stopped: set[str] = set()  # cancelled or deleted by a client: the task stores nothing more

    def __len__(self) -> int:
        return len(self._running)

    async def start(self, call, first, reply: ResponseReply) -> dict:
        """Store `reply`'s response in progress and go on reading `call` (its first message read) apart.
        The request was checked to be stored (`ResponsesRequest.refuse_unsupported`, `create_response`)."""
        body = reply.response("in_progress", [])
        await reply.settle(body)
        task = asyncio.create_task(self._finish(call, first, reply), name=f"background {reply.id}")
        self._running[reply.id] = (task, call)
        return body

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
        watcher = asyncio.create_task(self._watch(reply.id, call))
        try:
            body = await whole_reply(call, first, reply)
        except asyncio.CancelledError:
            body = None if reply.id in self._stopped else failed(reply, "the server stopped before the reply was done")
        except grpc.RpcError as exc:
            body = None if reply.id in self._stopped else failed(reply, f"{exc.code().name}: {exc.details()}")
        except Exception as exc:  # noqa: BLE001 - a bug: the response fails, we get the trace
            log.exception("background response %s", reply.id)
            body = failed(reply, f"internal error: {exc!r}")
        finally:
            watcher.cancel()
            call.cancel()  # a no-op once the call is done
        try:  # still listed as running while it stores: a cancel waits for it, then finds it ended
            if body is not None and reply.id not in self._stopped:
                await reply.settle(body)
                log.info("background response %s %s", reply.id, body["status"])
        finally:
            self._running.pop(reply.id, None)
            self._stopped.discard(reply.id)

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


def failed(reply: ResponseReply, message: str) -> dict:
    """The response object of a background response that could not be done."""
    return {**reply.response("failed", []), "error": {"code": "server_error", "message": message}}
