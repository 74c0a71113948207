"""python -m target_service: host the target model behind specdec.v1.TargetService."""

import os

# PyTorch backs large CPU allocations with transparent huge pages: about 5% faster decode.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from service_runtime.model_service import run_model_service
from specdec.engine import TargetEngine
from target_service.servicer import register


def main(argv: list[str] | None = None) -> None:
    run_model_service(argv, what="target_service", default_model="packaged:target", engine_cls=TargetEngine,
                      service_name="specdec.v1.TargetService", register=register)


if __name__ == "__main__":
    main()
