"""perseus: plan per-instruction GPU clocks for pipeline-parallel training.

Data flows profile -> :mod:`perseus.solver` -> :mod:`perseus.server` -> :mod:`perseus.client`
-> GPU.
"""

from __future__ import annotations

from perseus import _moved

__all__ = ["__version__"]

__version__ = "0.1.0"

_moved.install()
