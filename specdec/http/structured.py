"""Structured output as an OpenAI body asks for it: `response_format` (OpenAI's, and vLLM's `structural_tag` type),
and vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` and their newer form
`structured_outputs`, each read as a (kind, value) of `pb.Constraint`; at most one a request. A structural tag
goes as the Lark grammar that serves it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specdec.core.errors import InvalidArgument
from specdec.core.grammar import structural_tag_grammar
from specdec.http.errors import BadRequest

Asked = tuple[str, str, str | bool | list[str]]  # (the body's field, the constraint's kind, its value)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    schema_: dict = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")  # a structural tag's fields (vLLM's extension)
    type: Literal["text", "json_object", "json_schema", "structural_tag"] = "text"
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its newer form of the guided_* fields): one of these constraints. Its
    backend options (disable_*, whitespace_pattern) are accepted and ignored: JSON here is always compact."""
    model_config = ConfigDict(extra="ignore")
    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None


def schema_text(schema: dict | str, field: str) -> str:
    """A JSON schema given as an object or as JSON text (vLLM takes both), as JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"{field} must be a JSON schema: {exc}", field) from None
    if not isinstance(schema, (dict, bool)):
        raise BadRequest(f"{field} must be a JSON schema (an object)", field)
    return json.dumps(schema)


def structural_tag(tag: dict | str, field: str) -> str:
    """vLLM's structural tag, as an object or JSON text, as the Lark grammar that serves it
    (`specdec.core.grammar.structural_tag_grammar`)."""
    try:
        return structural_tag_grammar(json.loads(tag) if isinstance(tag, str) else tag)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"{field} must be a structural tag: {exc}", field) from None
    except InvalidArgument as exc:
        raise BadRequest(str(exc), field) from None


def requested(body) -> list[Asked]:
    """Every constraint a chat or completions body asks for, as (field, kind, value)."""
    asked: list[Asked] = []
    form = body.response_format
    if form is not None and form.type == "json_object":
        asked.append(("response_format", "json_object", True))
    if form is not None and form.type == "json_schema":
        if form.json_schema is None:
            raise BadRequest("response_format json_schema needs its json_schema", "response_format")
        asked.append(("response_format", "json_schema", json.dumps(form.json_schema.schema_)))
    if form is not None and form.type == "structural_tag":
        asked.append(("response_format", "lark", structural_tag(form.model_dump(), "response_format")))
    outputs = body.structured_outputs or StructuredOutputs()
    if outputs.structural_tag is not None:
        asked.append(("structured_outputs.structural_tag", "lark",
                      structural_tag(outputs.structural_tag, "structured_outputs.structural_tag")))
    for field, kind, value in [("guided_json", "json_schema", body.guided_json),
                               ("structured_outputs.json", "json_schema", outputs.json_),
                               ("guided_regex", "regex", body.guided_regex),
                               ("structured_outputs.regex", "regex", outputs.regex),
                               ("guided_choice", "choice", body.guided_choice),
                               ("structured_outputs.choice", "choice", outputs.choice),
                               ("guided_grammar", "lark", body.guided_grammar),
                               ("structured_outputs.grammar", "lark", outputs.grammar),
                               ("structured_outputs.json_object", "json_object", outputs.json_object or None)]:
        if value is not None:
            asked.append((field, kind, schema_text(value, field) if kind == "json_schema" else value))
    return asked


def the_one(asked: list[Asked]) -> tuple[str, str | bool | list[str]] | None:
    """The one constraint asked for, as (kind, value); None for none; more than one is refused."""
    if len(asked) > 1:
        raise BadRequest(f"at most one structured-output constraint, got {' and '.join(f for f, _, _ in asked)}",
                         asked[1][0])
    return asked[0][1:] if asked else None
