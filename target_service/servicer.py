"""TargetService: protobuf <-> TargetBackend.verify."""

from __future__ import annotations

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.engine.backend import TargetBackend
from specdec.engine.continuation import verify_and_continue
from specdec.runtime.sessions import SessionServicer
from specdec.runtime.draft_probs import decode_probs
from specdec.runtime.wire import logprob_requests_from_pb, logprobs_to_pb, pass_load_to_pb


class TargetServicer(SessionServicer, pb_grpc.TargetServiceServicer):
    engine: TargetBackend
    span_name = "target.compute"

    def _round(self, request: pb.VerifyRequest) -> pb.VerifyResult:
        commit = request.commit
        drafts = list(request.draft_tokens)
        q = decode_probs(request.draft_probs, len(drafts), self.engine.loaded.vocab_size)
        top, prompt_top = logprob_requests_from_pb(request.logprobs, request.prompt_logprobs, request.top_logprobs)
        result = verify_and_continue(self.engine, request.session_id, commit.start, list(commit.tokens), drafts, q,
                                     top, request.extra_steps, frozenset(request.stop_ids), prompt_top)
        return pb.VerifyResult(num_accepted=result.verdict.num_accepted, tokens=result.verdict.tokens,
                               compute_ns=int(result.compute_s * 1e9), rollback_ns=int(result.rollback.seconds * 1e9),
                               rolled_back_tokens=result.rollback.tokens,
                               load=pass_load_to_pb(result.load), logprobs=logprobs_to_pb(result.logprobs),
                               extra_passes=result.passes - 1, reused_tokens=result.reused,
                               prompt_logprobs=logprobs_to_pb(result.prompt_logprobs))


def register(server, engine: TargetBackend) -> None:
    pb_grpc.add_TargetServiceServicer_to_server(TargetServicer(engine), server)
