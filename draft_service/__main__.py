"""python -m draft_service: host the draft model behind specdec.v1.DraftService."""

import os

# PyTorch backs large CPU allocations with transparent huge pages: about 5% faster decode.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse  # noqa: E402

from draft_service.servicer import register  # noqa: E402
from service_runtime.model_service import (add_registry_args, model_service_config,  # noqa: E402
                                          model_service_parser, run_model_service)
from specdec.engine import DraftEngine  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = model_service_parser("draft_service", "packaged:draft")
    add_registry_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    run_model_service(model_service_config(build_parser().parse_args(argv)), what="draft_service", engine_cls=DraftEngine,
                      service_name="specdec.v1.DraftService", register=register)


if __name__ == "__main__":
    main()
