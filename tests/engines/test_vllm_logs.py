"""Kernel-selection parsing against vLLM's own logs, captured on the H200 with vLLM 0.26.0.

The fixtures are the complete logs of one generate process per arm (own checkpoint, run 1), as
``python -m int8alibi.tools.vllm_study --logs-to DIR`` copies them (captured 2026-12-02 on an
H200, the synthetic Qwen3-1.7B-shaped parent's own W8A8 checkpoint): lines vLLM wrote itself, not
written by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.engines import vllm_engine as ve
from int8alibi.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def _log(arm: str) -> str:
    return (FIXTURES / f"{arm}.vllm.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("arm", sorted(ve.ARM_KERNELS))
def test_the_real_log_names_exactly_the_requested_kernel_for_the_int8_scheme(arm: str) -> None:
    text = _log(arm)
    kernel = ve.ARM_KERNELS[arm][0]
    assert ve.parse_selection(text) == [ve.KernelSelection(kernel, ve.INT8_SCHEME)]
    evidence = ve.verify_selection(arm, ve.parse_selection(text), f"{arm}.vllm.log")
    assert evidence["selected"] == [f"{kernel} for {ve.INT8_SCHEME}"]
    assert evidence["environment"] == {ve.DISABLE_VAR: ve.ARM_KERNELS[arm][1] or "unset"}


def test_each_real_log_is_refused_for_the_other_arm() -> None:
    cutlass, triton = _log("vllm-cutlass"), _log("vllm-triton")
    with pytest.raises(InputError, match="requested TritonInt8ScaledMMLinearKernel, but vLLM selected Cutlass"):
        ve.verify_selection("vllm-triton", ve.parse_selection(cutlass), "vllm-cutlass.vllm.log")
    with pytest.raises(InputError, match="requested CutlassInt8ScaledMMLinearKernel, but vLLM selected Triton"):
        ve.verify_selection("vllm-cutlass", ve.parse_selection(triton), "vllm-triton.vllm.log")


def test_a_real_log_without_its_selection_line_is_refused() -> None:
    text = _log("vllm-cutlass")
    kept = "".join(line for line in text.splitlines(keepends=True) if "Selected" not in line)
    assert kept != text
    with pytest.raises(InputError, match="no kernel selection for CompressedTensorsW8A8Int8"):
        ve.verify_selection("vllm-cutlass", ve.parse_selection(kept), "stripped.log")
