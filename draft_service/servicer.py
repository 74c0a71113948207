"""DraftService: protobuf <-> DraftBackend.propose."""

from __future__ import annotations

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.engine.backend import DraftBackend
from specdec.runtime.sessions import SessionServicer
from specdec.runtime.draft_probs import encode_probs
from specdec.runtime.wire import pass_load_to_pb


class DraftServicer(SessionServicer, pb_grpc.DraftServiceServicer):
    engine: DraftBackend
    span_name = "draft.compute"

    def _round(self, request: pb.DraftRequest) -> pb.DraftProposal:
        commit = request.commit
        proposal = self.engine.propose(request.session_id, commit.start, list(commit.tokens), request.gamma,
                                       request.min_confidence, request.guess_first)
        return pb.DraftProposal(tokens=proposal.tokens, probs=encode_probs(proposal.probs),
                                compute_ns=int(proposal.compute_s * 1e9),
                                rollback_ns=int(proposal.rollback.seconds * 1e9),
                                rolled_back_tokens=proposal.rollback.tokens,
                                load=pass_load_to_pb(proposal.load), reused_tokens=proposal.reused)


def register(server, engine: DraftBackend) -> None:
    pb_grpc.add_DraftServiceServicer_to_server(DraftServicer(engine), server)
