"""Generation records in Redis: written every round, read back to resume on any orchestrator."""

from __future__ import annotations

import dataclasses
import logging

from orchestrator.request import GenerationRequest
from specdec.core.errors import FailedPrecondition, InvalidArgument, NotFound
from specdec.core.params import SamplingParams

log = logging.getLogger(__name__)


def request_record(request: GenerationRequest, owner: str = "") -> dict:
    """What a resume needs beside the tokens committed so far: the request as parsed, and who may resume."""
    return {"owner": owner, "prompt_ids": list(request.prompt_ids), "max_new_tokens": request.max_new_tokens,
            "params": dataclasses.asdict(request.params), "gamma": request.gamma, "stop": list(request.stop),
            "stop_ids": list(request.stop_ids), "ignore_eos": request.ignore_eos}


def resume_request(record: dict | None, session_id: str, resume_from: int, owner: str = "") -> GenerationRequest:
    """The GenerationRequest that continues a recorded generation; raises NotFound / FailedPrecondition.

    Only the credential that started a session may resume it; to any other it does not exist.
    """
    if record is None or record.get("owner", "") != owner:
        raise NotFound(f"no record of session {session_id!r} (never started here, or expired)")
    if record["finish_reason"]:
        raise FailedPrecondition(f"session {session_id!r} already finished ({record['finish_reason']})")
    generated = record["generated"]
    if resume_from > len(generated):
        raise InvalidArgument(f"resume_from {resume_from} is past the {len(generated)} tokens generated so far")
    return GenerationRequest(record["prompt_ids"], record["max_new_tokens"], SamplingParams(**record["params"]),
                             record["gamma"], tuple(record["stop"]), resumed=tuple(generated),
                             resume_from=resume_from, stop_ids=tuple(record.get("stop_ids", ())),
                             ignore_eos=record.get("ignore_eos", False))


class RecordWriter:
    """Saves a generation's record after every round; a Redis error is logged, never fatal."""

    def __init__(self, store, session_id: str, request: GenerationRequest, owner: str = ""):
        self.session_id = session_id
        self.record = store.record(session_id, request_record(request, owner))

    def __call__(self, generated: list[int], finish: str) -> None:
        try:
            self.record.save(generated, finish)
        except Exception as exc:  # noqa: BLE001 - Redis trouble must not fail the generation
            log.warning("session %s: record not saved: %s", self.session_id, exc)
