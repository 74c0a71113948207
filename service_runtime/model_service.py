"""Process entry point shared by the draft and target services."""

from __future__ import annotations

import argparse
import logging
from typing import Callable

import grpc
import torch

from service_runtime.server import add_model_args, announce_and_wait, configure_logging, start_server
from specdec.engine import Engine
from specdec.models import load_model

log = logging.getLogger(__name__)


def run_model_service(argv: list[str] | None, *, what: str, default_model: str, engine_cls: type[Engine],
                      service_name: str, register: Callable[[grpc.Server, Engine], None]) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {what}", description=f"specdec {what}")
    add_model_args(parser, default_model)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    log.info("loading %s on %s", args.model, args.device)
    loaded = load_model(args.model, args.device, args.dtype)
    engine = engine_cls(loaded, max_sessions=args.max_sessions, max_gamma=args.max_gamma)
    running = start_server(lambda server: register(server, engine), [service_name], args.host, args.port)
    announce_and_wait(running, what)
