"""Every setting is defined once, as a config field, and its flag maps to it both ways: parsing the
flags a config writes gives that config back, through the real entry points' parsers."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from draft_service.__main__ import build_parser as draft_parser
from orchestrator.__main__ import build_parser as orchestrator_parser
from orchestrator.flags import orchestrator_config
from orchestrator.servicer import OrchestratorConfig
from specdec.cli.main import build_parser as cli_parser
from specdec.cli.options import stack_options
from specdec.http.flags import HttpConfig, add_http_args, http_config
from specdec.launch.stack import StackOptions
from specdec.runtime.model_service_config import DRAFT_ONLY, ModelServiceConfig, model_service_config
from specdec.runtime.options import add_options, from_options, option_argv, options_of
from specdec.runtime.server import ServerConfig
from target_service.__main__ import TensorParallel
from target_service.__main__ import build_parser as target_parser

CONFIGS = [OrchestratorConfig, ModelServiceConfig, ServerConfig, TensorParallel, HttpConfig]
ENVIRONMENT = ("SPECDEC_HEALTH_PORT", "OTEL_EXPORTER_OTLP_ENDPOINT", "SPECDEC_TRACE_FILE", "SPECDEC_PROFILE_CACHE",
               "SPECDEC_REDIS_URL", "SPECDEC_ADVERTISE")


@pytest.fixture(autouse=True)
def no_environment_defaults(monkeypatch):
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


def changed(config_cls, skip=()):
    """A config whose every option differs from its default (a value of its type, one of its choices)."""
    values = {}
    for name, (field, opt, kind) in options_of(config_cls).items():
        if name in skip:
            continue
        if opt.choices:
            values[name] = next(c for c in reversed(opt.choices) if c != field.default)
        elif kind is bool:
            values[name] = not field.default
        elif kind is str:
            values[name] = f"{name}-value"
        else:
            values[name] = kind(field.default + 3)
    return config_cls(**values)


def parser_for(config_cls) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_options(parser, config_cls)
    return parser


@pytest.mark.parametrize("config_cls", CONFIGS, ids=lambda c: c.__name__)
def test_flags_and_config_round_trip(config_cls):
    for config in (config_cls(), changed(config_cls)):
        args = parser_for(config_cls).parse_args(option_argv(config))
        assert from_options(config_cls, args) == config


@pytest.mark.parametrize("config_cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_flags_default_is_its_fields(config_cls):
    """No flags: the config's own defaults, because the flags take them from the fields."""
    assert from_options(config_cls, parser_for(config_cls).parse_args([])) == config_cls()
    assert options_of(config_cls), "a config with no options"


def test_an_environment_variable_overrides_a_default(monkeypatch):
    monkeypatch.setenv("SPECDEC_PROFILE_CACHE", "/tmp/profiles")
    config = model_service_config(draft_parser().parse_args([]))
    assert config.profile_cache == "/tmp/profiles"


def test_the_services_entry_points_take_every_option_of_their_config():
    draft = dataclasses.replace(changed(ModelServiceConfig), security=ModelServiceConfig.security)
    assert model_service_config(draft_parser().parse_args(option_argv(draft))) == draft
    target = changed(ModelServiceConfig, skip=DRAFT_ONLY)
    args = target_parser().parse_args([*option_argv(target, skip=DRAFT_ONLY), *option_argv(changed(TensorParallel))])
    assert model_service_config(args) == target
    assert from_options(TensorParallel, args) == changed(TensorParallel)
    with pytest.raises(SystemExit):  # the registry flags belong to draft replicas
        target_parser().parse_args(["--redis-url", "redis://x"])


def test_the_orchestrator_and_http_flags_round_trip():
    config = changed(OrchestratorConfig)
    http = dataclasses.replace(changed(HttpConfig), endpoint="127.0.0.1:1", tokenizer="tiny:seed=0")
    args = orchestrator_parser().parse_args(["--target", "127.0.0.1:1", *option_argv(config), *option_argv(http)])
    assert orchestrator_config(args) == config
    assert http_config(args, http.endpoint, http.tokenizer) == http
    parser = argparse.ArgumentParser()
    add_http_args(parser)
    assert http_config(parser.parse_args(option_argv(http)), http.endpoint, http.tokenizer) == http


def test_a_stack_hands_its_configs_to_its_children_unchanged():
    """The stack writes each child's flags from the configs: parsed by the child, they are the configs
    (the model, and the profile sizes, γ_max + 1, set per service)."""
    opts = StackOptions(service=changed(ModelServiceConfig, skip=("model", "profile_tokens", "threads")),
                        orchestrator=changed(OrchestratorConfig))
    draft = model_service_config(draft_parser().parse_args(opts.service_argv("tiny:seed=1")))
    assert draft == dataclasses.replace(opts.service, model="tiny:seed=1",
                                        profile_tokens=opts.orchestrator.gamma_max + 1)
    target = model_service_config(target_parser().parse_args(opts.service_argv("tiny:seed=2", draft=False)))
    assert target == dataclasses.replace(opts.service, model="tiny:seed=2", **{
        name: getattr(ModelServiceConfig, name) for name in DRAFT_ONLY}, profile_tokens=opts.orchestrator.gamma_max + 1)
    args = orchestrator_parser().parse_args(opts.orchestrator_argv("d:1", "t:2"))
    assert orchestrator_config(args) == opts.orchestrator
    assert (args.draft, args.target, args.log_level, args.host) == ("d:1", "t:2", opts.service.log_level,
                                                                     opts.service.host)


def test_the_old_spelling_of_the_gamma_limit_still_works_with_a_warning(capsys):
    args = draft_parser().parse_args(["--max-gamma", "5"])
    assert model_service_config(args).gamma_max == 5
    assert "--max-gamma is deprecated" in capsys.readouterr().err
    assert model_service_config(draft_parser().parse_args(["--gamma-max", "7"])).gamma_max == 7
    assert "deprecated" not in capsys.readouterr().err


def test_the_commands_flags_reach_the_right_config():
    """`specdec serve` holds the orchestrator's and the services' options in one parser: --gamma-max and
    --port are the orchestrator's, the compute path and telemetry the services', --max-concurrent both."""
    args = cli_parser().parse_args(["serve", "--gamma-max", "5", "--port", "1234", "--device", "cpu", "--dtype",
                                    "float32", "--max-concurrent", "7", "--trace-file", "t.jsonl", "--log-level",
                                    "info", "--proposer", "ngram", "--redis-url", "redis://r"])
    opts = stack_options(args, port=args.port)
    assert opts.orchestrator == OrchestratorConfig(gamma_max=5, max_concurrent=7, proposer="ngram")
    assert opts.service == ModelServiceConfig(device="cpu", dtype="float32", max_sessions=7, trace_file="t.jsonl",
                                              log_level="info", redis_url="redis://r", grammar_warmup="off")
    assert opts.port == 1234 and opts.service.gamma_max == ModelServiceConfig.gamma_max
    defaults = stack_options(cli_parser().parse_args(["generate", "--prompt", "x"]))
    assert (defaults.service, defaults.orchestrator) == \
        (StackOptions.service, dataclasses.replace(StackOptions.orchestrator, feed_between_turns="off"))


def test_a_benchmark_meets_each_prompt_fresh():
    """`specdec bench` keeps no lookup memory across requests (a config would look up the outputs of the
    configs that ran the prompt before it); `specdec serve` keeps the default."""
    assert stack_options(cli_parser().parse_args(["bench"])).orchestrator.lookup_memory_tokens == 0
    served = stack_options(cli_parser().parse_args(["serve"])).orchestrator
    assert served.lookup_memory_tokens == OrchestratorConfig.lookup_memory_tokens > 0


def test_only_a_server_feeds_its_drafts_between_turns():
    """A reply's draft is fed for the conversation's next turn (`Drafting.finish`) by `specdec serve`, not by the
    commands whose prompts are no conversation: bench, profile, a one-shot generate."""
    def feeds(*argv: str) -> str:
        return stack_options(cli_parser().parse_args(list(argv))).orchestrator.feed_between_turns

    assert feeds("serve") == OrchestratorConfig.feed_between_turns == "auto"
    assert feeds("bench") == feeds("profile") == feeds("generate", "--prompt", "x") == "off"
    assert feeds("bench", "--feed-between-turns", "auto") == "auto"


def test_bench_gammas_are_fixed_gammas_or_a_clear_error(capsys):
    """`--gammas` takes integers >= 1 (target-only and adaptive always run); anything else is a usage error
    that names the flag, not a traceback from inside the benchmark."""
    assert cli_parser().parse_args(["bench", "--gammas", "1, 3"]).gammas == [1, 3]
    assert cli_parser().parse_args(["bench", "--gammas", ""]).gammas == []
    for bad in ("auto", "0,2", "2,x"):
        with pytest.raises(SystemExit):
            cli_parser().parse_args(["bench", "--gammas", bad])
        assert "--gammas" in capsys.readouterr().err
