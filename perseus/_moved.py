"""Old import paths of modules that moved: each still imports, as the new module, with a
DeprecationWarning naming where it lives now. One table, read by one import hook."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "perseus.errors": "perseus.core.errors",
    "perseus.defaults": "perseus.core.defaults",
    "perseus.baselines": "perseus.core.baselines",
    "perseus.files": "perseus.formats.plan_files",
    "perseus.client.deepspeed": "perseus.client.integrations.deepspeed",
    "perseus.client.megatron": "perseus.client.integrations.megatron",
    "perseus.client.torch_pipelining": "perseus.client.integrations.torch_pipelining",
    "perseus.client.controller": "perseus.client.clocks.controller",
    "perseus.client.aim": "perseus.client.clocks.aim",
    "perseus.client.boundary": "perseus.client.clocks.boundary",
    "perseus.client.nvml": "perseus.client.gpu.nvml",
    "perseus.client.fake": "perseus.client.gpu.fake",
    "perseus.client.fake_model": "perseus.client.gpu.fake_model",
    "perseus.client.fake_probe": "perseus.client.gpu.fake_probe",
    "perseus.client.meter": "perseus.client.gpu.meter",
    "perseus.client.profiler": "perseus.client.profiling.profiler",
    "perseus.client.online": "perseus.client.profiling.online",
    "perseus.client.measurements": "perseus.client.profiling.measurements",
    "perseus.client.stream_sampling": "perseus.client.profiling.stream_sampling",
    "perseus.client.wait_power": "perseus.client.profiling.wait_power",
    "perseus.client.standalone": "perseus.client.profiling.standalone",
    "perseus.client.planner": "perseus.client.api.client",
    "perseus.client.planner_http": "perseus.client.api.http",
    "perseus.client.retry": "perseus.client.api.retry",
    "perseus.server.routes": "perseus.server.api.routes",
    "perseus.server.auth": "perseus.server.api.auth",
    "perseus.server.metrics": "perseus.server.api.metrics",
    "perseus.server.jobs": "perseus.server.lifecycle.jobs",
    "perseus.server.migrations": "perseus.server.store.migrations",
}
"""Old module name -> the module that holds its code now."""


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self._old = old
        self._new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self._old} moved to {self._new}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self._new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when it was imported."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Answer the old names (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
