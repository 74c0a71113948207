"""python -m draft_service: host the draft model behind specdec.v1.DraftService."""

import os

# PyTorch backs large CPU allocations with transparent huge pages: about 5% faster decode.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from draft_service.servicer import register
from service_runtime.model_service import run_model_service
from specdec.engine import DraftEngine


def main(argv: list[str] | None = None) -> None:
    run_model_service(argv, what="draft_service", default_model="packaged:draft", engine_cls=DraftEngine,
                      service_name="specdec.v1.DraftService", register=register)


if __name__ == "__main__":
    main()
