"""Configuration fields that are also command-line flags: each defined once, mapped both ways.

A dataclass field declared with `option(...)` is a flag. Its name (`--field-name`, or `flag`), type,
default, help and choices come from that one declaration:

    add_options(parser, Config)          the flags, with the field defaults (or an environment variable's)
    from_options(Config, args)           the parsed flags as a Config
    option_argv(config)                  the flags that reproduce `config`: what a parent hands a child
                                         (the options that differ from their defaults; for the others a
                                         child, like its parent, reads the environment variables)

`from_options(C, parser.parse_args(option_argv(c))) == c` for every config `c` (tested). No argparse
Namespace travels past the `from_options` call.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from dataclasses import dataclass, field

OPTION = "specdec.option"


@dataclass(frozen=True)
class Option:
    flag: str = ""  # default: --field-name
    help: str = ""
    choices: tuple = ()
    env: str = ""  # an environment variable that overrides the default when set
    deprecated: tuple[str, ...] = ()  # old spellings, still accepted with a warning


def option(default, help: str = "", *, flag: str = "", choices=(), env: str = "", deprecated=()):
    """A dataclass field that is also a flag."""
    return field(default=default, metadata={OPTION: Option(flag, help, tuple(choices), env, tuple(deprecated))})


def options_of(config_cls, only=None, skip=()) -> dict[str, tuple[dataclasses.Field, Option, type]]:
    """name -> (field, its Option, its type), for the fields of `config_cls` that are flags (those named
    in `only`, if given; none named in `skip`)."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: (f, f.metadata[OPTION], hints[f.name]) for f in dataclasses.fields(config_cls)
            if OPTION in f.metadata and (only is None or f.name in only) and f.name not in skip}


def flag_of(name: str, opt: Option) -> str:
    return opt.flag or "--" + name.replace("_", "-")


class _Store(argparse.Action):
    """Stores like the default action; an old spelling also prints a warning."""

    def __init__(self, option_strings, dest, deprecated=(), **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.deprecated = deprecated

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.deprecated:
            sys.stderr.write(f"warning: {option_string} is deprecated and will be removed; "
                             f"use {self.option_strings[0]}\n")
        setattr(namespace, self.dest, values)


def add_options(parser: argparse.ArgumentParser, config_cls, only=None, skip=(), defaults=None) -> None:
    """Add the flags of `config_cls` (those named in `only`, if given; none in `skip`). `defaults`
    overrides field defaults for this parser (a service's own model, say)."""
    defaults = defaults or {}
    taken = {action.dest for action in parser._actions}
    for name, (f, opt, kind) in options_of(config_cls, only, skip).items():
        if name in taken:  # two configs' fields of one name in one parser: pick one with `only`
            raise ValueError(f"{config_cls.__name__}.{name}: the parser already has an option stored as {name!r}")
        default = defaults.get(name, f.default)
        if opt.env and opt.env in os.environ:
            default = kind(os.environ[opt.env])
        names = [flag_of(name, opt), *opt.deprecated]
        extra = {"choices": opt.choices} if opt.choices else {"metavar": names[0][2:].replace("-", "_").upper()}
        if kind is bool:
            parser.add_argument(*names, dest=name, action=argparse.BooleanOptionalAction, default=default,
                                help=opt.help)
        else:
            parser.add_argument(*names, dest=name, type=kind, default=default, help=opt.help,
                                action=_Store, deprecated=opt.deprecated, **extra)


def from_options(config_cls, args: argparse.Namespace, only=None, **fixed):
    """`config_cls` from the parsed flags (those the parser has, of those named in `only` if given: a
    parser that holds two configs' options may hold two fields of one name); `fixed` sets other fields."""
    values = {name: getattr(args, name) for name in options_of(config_cls, only) if hasattr(args, name)}
    return config_cls(**{**values, **fixed})


def option_argv(config, only=None, skip=()) -> list[str]:
    """The flags that set each option field of `config` that differs from its default (those in `only`,
    if given; none in `skip`)."""
    argv = []
    for name, (f, opt, kind) in options_of(type(config), only, skip).items():
        value = getattr(config, name)
        if value == f.default:
            continue
        if kind is bool:
            argv.append(flag_of(name, opt) if value else "--no-" + flag_of(name, opt)[2:])
        else:
            argv += [flag_of(name, opt), str(value)]
    return argv
