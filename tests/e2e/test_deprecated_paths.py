"""The integrations' old import paths still work, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("name", "framework"),
    [("torch_pipelining", "torch"), ("megatron", "megatron.core"), ("deepspeed", "deepspeed")],
)
def test_the_old_path_warns_and_is_the_new_module(
    name: str, framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(framework)
    new = importlib.import_module(f"perseus.client.integrations.{name}")
    monkeypatch.delitem(sys.modules, f"perseus.client.{name}", raising=False)
    with pytest.warns(DeprecationWarning, match=f"perseus.client.integrations.{name}"):
        old = importlib.import_module(f"perseus.client.{name}")
    assert old.instrument is new.instrument
    assert set(old.__all__) == set(new.__all__)
    for public in new.__all__:
        assert getattr(old, public) is getattr(new, public)


def test_importing_the_integrations_package_imports_no_framework() -> None:
    import subprocess

    code = (
        "import sys, perseus.client, perseus.client.integrations\n"
        "heavy = ('torch', 'megatron', 'deepspeed')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
