"""python -m draft_service: host the draft model behind specdec.v1.DraftService (`--model lookup`: no
model, n-gram lookups; `specdec.engine.lookup_engine`)."""

import argparse
import logging

from draft_service.servicer import register
from specdec.engine.lookup_engine import LOOKUP_MODEL, LookupEngine
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.models import draft_vocabulary
from specdec.runtime.model_service import load_engine, run_model_service
from specdec.runtime.model_service_config import ModelServiceConfig, model_service_config, model_service_parser
from specdec.runtime.server import exit_now

log = logging.getLogger("draft_service")


def build_parser() -> argparse.ArgumentParser:
    return model_service_parser("draft_service", "packaged:draft")


def build_engine(config: ModelServiceConfig) -> DraftEngine | LookupEngine:
    if config.model == LOOKUP_MODEL:
        return LookupEngine(config.max_sessions, config.gamma_max, config.lookup_memory_tokens)
    engine = load_engine(config, DraftEngine, draft_weights=config.draft_weights)
    loaded = engine.loaded
    ranges = draft_vocabulary(loaded.vocab_size, loaded.eos_token_ids, config.draft_vocab)
    if ranges and loaded.runner.limit_vocabulary(ranges):
        log.info("the output layer scores %d of %d token ids (--draft-vocab)", loaded.scored_tokens, loaded.vocab_size)
    elif ranges and config.draft_vocab > 0:
        log.warning("--draft-vocab %d: the %s path scores every token id", config.draft_vocab, loaded.choice.path)
    return engine


def main(argv: list[str] | None = None) -> None:
    run_model_service(model_service_config(build_parser().parse_args(argv)), what="draft_service", build=build_engine,
                      service_name="specdec.v1.DraftService", register=register)


if __name__ == "__main__":
    main()
    exit_now()  # skip the interpreter's teardown (about a second)
