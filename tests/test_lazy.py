"""fedcme_core.common.lazy: a stand-in imports its module on first use, and a thread that reads
it while another thread is still importing the module waits for the whole module."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from fedcme_core.common.lazy import lazy_module


def test_first_read_imports_and_later_replacements_are_seen(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_plain.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stand_in = lazy_module("lazy_probe_plain")
    assert "lazy_probe_plain" not in sys.modules
    try:
        assert stand_in.value == 1
        assert "lazy_probe_plain" in sys.modules
        monkeypatch.setattr(sys.modules["lazy_probe_plain"], "value", 2)
        assert stand_in.value == 2
        with pytest.raises(AttributeError):
            stand_in.missing
    finally:
        sys.modules.pop("lazy_probe_plain", None)


def test_a_read_during_another_threads_import_waits_for_the_whole_module(tmp_path, monkeypatch):
    """The race a threaded Dask runner met: worker A is running the module's code (it is in
    sys.modules, half initialized) when worker B reads an attribute defined further down."""
    gate = types.ModuleType("lazy_probe_gate")
    gate.started, gate.release = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "lazy_probe_gate", gate)
    (tmp_path / "lazy_probe_slow.py").write_text(
        "import lazy_probe_gate\nlazy_probe_gate.started.set()\nlazy_probe_gate.release.wait(10)\nvalue = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stand_in = lazy_module("lazy_probe_slow")
    outcome: dict[str, object] = {}

    def read() -> None:
        try:
            outcome["value"] = stand_in.value
        except AttributeError as error:
            outcome["error"] = error

    try:
        importer = threading.Thread(target=lambda: stand_in.__getattr__("value"))
        importer.start()
        assert gate.started.wait(10)
        assert "lazy_probe_slow" in sys.modules  # half initialized: `value` not yet defined
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.3)
        assert reader.is_alive(), f"the reader did not wait for the import: {outcome}"
        gate.release.set()
        reader.join(10)
        importer.join(10)
        assert outcome == {"value": 42}
    finally:
        gate.release.set()
        sys.modules.pop("lazy_probe_slow", None)
