"""A request body checked against its model: pydantic's first problem, and what the model refuses to serve
(`refuse_unsupported`), as a `BadRequest` naming the field as the client did."""

from __future__ import annotations

import re
import types
from typing import Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from specdec.http.errors import BadRequest


def parse(model: type[BaseModel], body: bytes):
    """Validate a JSON body, then refuse what it asks for that cannot be served; any problem is a BadRequest
    naming the field."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        raise bad_request(exc, model) from None
    request.refuse_unsupported()
    return request


def validated(model: type[BaseModel], data: dict, renames: dict[str, str] | None = None):
    """As `parse`, for a body built from another one: `renames` maps a field's name here to the name the
    client gave it."""
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc, model, renames) from None
    try:
        request.refuse_unsupported()
    except BadRequest as exc:
        raise BadRequest(str(exc), (renames or {}).get(exc.param, exc.param)) from None
    return request


def bad_request(exc: ValidationError, model: type[BaseModel], renames: dict[str, str] | None = None) -> BadRequest:
    """The first problem pydantic found, naming the field as the client did; a field of several types that
    matched none says which it takes (pydantic's own message names the first alternative alone)."""
    errors = exc.errors()
    loc = [str(part) for part in errors[0]["loc"]]
    alternatives = [e["loc"][1] for e in errors if len(e["loc"]) > 1 and e["loc"][0] == errors[0]["loc"][0]]
    if loc and renames and loc[0] in renames:
        loc = [renames[loc[0]]]
    if loc and _is_union(model, errors[0]["loc"][0]) and alternatives:
        expected = " or ".join(dict.fromkeys(_json_type(str(a)) for a in alternatives))
        return BadRequest(f"{loc[0]} must be {expected}", loc[0])
    where = ".".join(loc)
    return BadRequest(f"{where}: {errors[0]['msg']}" if where else errors[0]["msg"], where or None)


def _is_union(model: type[BaseModel], name) -> bool:
    """Does the field take values of several types (beyond null)?"""
    field = model.model_fields.get(name) if isinstance(name, str) else None
    if field is None or get_origin(field.annotation) not in (Union, types.UnionType):
        return False
    return len([a for a in get_args(field.annotation) if a is not type(None)]) > 1


def _json_type(tag: str) -> str:
    """A pydantic union member's tag in JSON's words: 'list[str]' -> 'an array of strings'."""
    words = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
    if tag in words:
        return words[tag]
    if tag.startswith("dict["):
        return "an object"
    array = re.fullmatch(r"list\[(\w+)\]", tag)
    if array and array.group(1) in words:
        return f"an array of {words[array.group(1)].split()[-1]}s"
    return "an array" if tag.startswith("list[") else tag
