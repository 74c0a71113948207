"""Structured-output constraints compiled to llguidance grammars (text in, grammar text out).

The engine (`specdec.engine.constraint`) turns a grammar into masks; the orchestrator compiles a
request's constraint here, so a bad schema is refused before any service is called.
"""

from __future__ import annotations

from specdec.core.errors import InvalidArgument

KINDS = ("json_schema", "json_object", "regex", "lark", "choice")
# JSON as json.dumps writes it: ", " and ": " and no other whitespace, so a model cannot spend its tokens on
# blanks (a schema's own "x-guidance" options override this).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def compile_constraint(kind: str, value: str | list[str]) -> str:
    """A request's constraint as an llguidance grammar: kind "json_schema" (value: the schema as
    JSON), "json_object" (any object), "regex", "lark" or "choice" (value: the strings allowed, one of
    them whole). Raises InvalidArgument if it is invalid."""
    import json

    import llguidance

    try:
        if kind == "choice":
            grammar = llguidance.LLMatcher.grammar_from_lark(choice_grammar(value))
        elif kind in ("json_object", "json_schema"):
            schema = {"type": "object"} if kind == "json_object" else json.loads(value)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(value)
        elif kind == "lark":
            grammar = llguidance.LLMatcher.grammar_from_lark(value)
        else:
            raise InvalidArgument(f"unknown constraint kind {kind!r}")
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"invalid {kind.replace('_', ' ')}: {exc}") from None
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise InvalidArgument(f"invalid {kind.replace('_', ' ')}: {message}")
    return grammar


def structural_tag_grammar(tag: dict) -> str:
    """vLLM's structural tag (`{"type": "structural_tag", "structures": [{"begin", "schema", "end"}], "triggers"}`)
    as a Lark grammar: free text, in which a trigger starts the structure whose `begin` starts with it, and that
    structure is then its `begin`, JSON following its `schema` (laid out as every JSON output here), and its `end`."""
    import llguidance

    structures, triggers = (tag.get("structures"), tag.get("triggers")) if isinstance(tag, dict) else (None, None)
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or \
            not all(isinstance(t, str) and t for t in triggers):
        raise InvalidArgument("invalid structural tag: give structures (a list of {begin, schema, end}) and triggers "
                              "(a list of strings)")
    tags = []
    for structure in structures:
        begin, end, schema = (structure.get(key) if isinstance(structure, dict) else None
                              for key in ("begin", "end", "schema"))
        if not isinstance(begin, str) or not isinstance(end, str) or not isinstance(schema, dict):
            raise InvalidArgument("invalid structural tag: each structure needs begin and end (strings) and schema")
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise InvalidArgument(f"invalid structural tag: no trigger begins {begin!r}")
        tags.append(llguidance.StructTag(trigger=trigger, begin=begin, grammar={**schema, "x-guidance": JSON_LAYOUT},
                                         end=end))
    return llguidance.StructTag.to_grammar(tags, assume_special=False)


def choice_grammar(options: list[str]) -> str:
    """A Lark grammar whose language is exactly `options`: each a string literal, JSON's escapes being the
    dialect's."""
    import json

    if not options:
        raise InvalidArgument("invalid choice: give at least one option")
    return "start: " + " | ".join(json.dumps(option) for option in dict.fromkeys(options))
