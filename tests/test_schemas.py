"""perseus.schemas re-exports the wire models (their tests: tests/wire, one per module)."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest
from pydantic import BaseModel

import perseus.schemas
from perseus.wire import common, jobs, ranks, views
from perseus.wire.common import WireModel


@pytest.mark.parametrize("module", [common, jobs, ranks, views], ids=lambda m: m.__name__)
def test_every_wire_model_is_importable_from_schemas(module: ModuleType) -> None:
    models = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseModel)
        and value.__module__ == module.__name__
        and value is not WireModel  # the base, not a message
    ]
    assert models
    for model in models:
        assert getattr(perseus.schemas, model.__name__, None) is model, model.__qualname__
        assert model.__name__ in perseus.schemas.__all__


def test_everything_schemas_exports_exists() -> None:
    missing = [name for name in perseus.schemas.__all__ if not hasattr(perseus.schemas, name)]
    assert missing == []
    assert len(set(perseus.schemas.__all__)) == len(perseus.schemas.__all__)
