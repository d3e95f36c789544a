"""Deprecated: moved to :mod:`perseus.client.integrations.deepspeed`; this alias will go."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from perseus.client.integrations.deepspeed import *  # noqa: F403
from perseus.client.integrations.deepspeed import __all__ as __all__

_NEW = "perseus.client.integrations.deepspeed"

warnings.warn(
    f"{__name__} moved to {_NEW}; import it from there",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(_NEW), name)
