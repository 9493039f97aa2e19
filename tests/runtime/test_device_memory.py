"""Peak device memory goes to the log in one parseable line, and is read back from it."""

from __future__ import annotations

import logging
import sys
import types

from int8alibi.runtime import device_memory


def _fake_torch(initialised: bool) -> types.ModuleType:
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialised,
                                 current_device=lambda: 0, max_memory_allocated=lambda d: 1234,
                                 max_memory_reserved=lambda d: 5678, get_device_name=lambda d: "NVIDIA H200")
    return types.SimpleNamespace(cuda=cuda)  # type: ignore[return-value]


def test_logged_line_is_read_back(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True))
    with caplog.at_level(logging.INFO):
        device_memory.log_peak_device_memory(logging.getLogger("stage"))
    log = tmp_path / "stage.log"
    log.write_text("2026 stage INFO start\n" + "".join(f"2026 stage INFO {r.getMessage()}\n" for r in caplog.records)
                   + f"2026 stage INFO {device_memory.PREFIX} peak_allocated_bytes=1 peak_reserved_bytes=99 device=x\n")
    assert "peak_allocated_bytes=1234 peak_reserved_bytes=5678 device=NVIDIA H200" in caplog.text
    assert device_memory.peak_reserved_bytes(log) == 5678  # the largest of the lines


def test_nothing_is_logged_without_cuda(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False))
    with caplog.at_level(logging.INFO):
        device_memory.log_peak_device_memory(logging.getLogger("stage"))
    monkeypatch.delitem(sys.modules, "torch")
    with caplog.at_level(logging.INFO):
        device_memory.log_peak_device_memory(logging.getLogger("stage"))  # torch never imported
    assert caplog.text == ""
    (tmp_path / "plain.log").write_text("no such line\n")
    assert device_memory.peak_reserved_bytes(tmp_path / "plain.log") is None
