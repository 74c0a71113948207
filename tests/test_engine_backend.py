"""Every backend a service can host implements the interface of `specdec.engine.backend`, with the
Protocols' own signatures; and a closed backend runs nothing."""

from __future__ import annotations

import inspect

import pytest

from specdec.engine.backend import Backend, DraftBackend, TargetBackend
from specdec.engine.lookup_engine import LookupEngine
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.target_engine import TargetEngine
from target_service.tensor_parallel import TensorParallelTarget

IMPLEMENTATIONS = [(DraftEngine, DraftBackend), (LookupEngine, DraftBackend), (TargetEngine, TargetBackend),
                   (TensorParallelTarget, TargetBackend)]


def members(protocol) -> dict[str, object]:
    """The Protocol's methods and properties (its own and its bases'), and its declared attributes."""
    found = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False):  # object, and typing's own classes
            continue
        found.update({name: None for name in getattr(cls, "__annotations__", {})})
        found.update({name: value for name, value in vars(cls).items()
                      if not name.startswith("_") and (callable(value) or isinstance(value, property))})
    return found


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("implementation,protocol", IMPLEMENTATIONS, ids=lambda x: getattr(x, "__name__", x))
def test_a_backend_has_every_member_with_the_protocols_signature(implementation, protocol):
    wanted = members(protocol)
    assert {"open", "release", "close", "reports", "measure_costs", "gamma_max", "loaded"} <= set(wanted)
    for name, declared in wanted.items():
        found = inspect.getattr_static(implementation, name, None)
        if found is None:  # an attribute set in __init__: its name is in the constructor's body
            assert f"self.{name}" in inspect.getsource(implementation.__init__) or \
                hasattr(implementation, name), f"{implementation.__name__} lacks {name}"
            continue
        if callable(declared) and not isinstance(declared, property):
            assert parameters(found) == parameters(declared), f"{implementation.__name__}.{name}"


def test_the_protocols_say_which_side_they_serve():
    assert "propose" in members(DraftBackend) and "propose" not in members(TargetBackend)
    assert "verify" in members(TargetBackend) and "verify" not in members(Backend)
