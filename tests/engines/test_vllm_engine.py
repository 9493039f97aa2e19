"""The vLLM backend's non-GPU parts: environment, arguments, kernel-selection log parsing, refusal."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from int8alibi.engines import vllm_engine as ve
from int8alibi.errors import InputError

# Shaped like vLLM 0.33's log lines (format "(<process> pid=<pid>) LEVEL mm-dd hh:mm:ss [file:line] msg").
CUTLASS_LOG = """\
(EngineCore pid=4242) INFO 11-29 08:40:01 [model.py:1021] Resolved architecture: Qwen3ForCausalLM
(EngineCore pid=4242) INFO 11-29 08:40:07 [__init__.py:870] Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8
(EngineCore pid=4242) INFO 11-29 08:40:09 [gpu_model_runner.py:2410] Model loading took 2.1 GiB
"""
TRITON_LOG = "\x1b[32mINFO\x1b[0m 11-29 08:41:07 [__init__.py:870] Selected TritonInt8ScaledMMLinearKernel for " \
             "CompressedTensorsW8A8Int8\n"


def test_triton_arm_disables_the_cutlass_kernel_and_cutlass_arm_drops_any_inherited_switch() -> None:
    base = {"PATH": "/usr/bin", ve.DISABLE_VAR: "CutlassInt8ScaledMMLinearKernel,MacheteLinearKernel"}
    triton = ve.arm_environment("vllm-triton", base)
    cutlass = ve.arm_environment("vllm-cutlass", base)
    assert triton[ve.DISABLE_VAR] == "CutlassInt8ScaledMMLinearKernel"
    assert ve.DISABLE_VAR not in cutlass
    for env in (triton, cutlass):
        assert env["PATH"] == "/usr/bin" and env["VLLM_LOGGING_LEVEL"] == "INFO" and env["NO_COLOR"] == "1"
    assert base[ve.DISABLE_VAR].startswith("Cutlass")  # the caller's mapping is not modified
    with pytest.raises(InputError, match="not a vLLM arm"):
        ve.arm_environment("exact-cutlass-order", base)


def test_runner_arguments_and_request() -> None:
    argv = ve.runner_argv(Path("/w/req.json"), Path("/w/out.json"), python="/py")
    assert argv == ["/py", "-m", "int8alibi.engines.vllm_engine", "--request", "/w/req.json", "--output", "/w/out.json"]
    req = ve.request_payload(Path("/ckpt"), [[1, 2], [3]], 64)
    assert req == {"checkpoint": "/ckpt", "prompts": [[1, 2], [3]], "new_tokens": 64,
                   "llm": {**ve.LLM_SETTINGS, "max_model_len": 66, "seed": ve.SEED}}
    with pytest.raises(InputError, match="new_tokens"):
        ve.request_payload(Path("/ckpt"), [[1]], 0)
    with pytest.raises(InputError, match="at least one token"):
        ve.request_payload(Path("/ckpt"), [[1], []], 4)


def test_the_model_length_is_the_longest_prompt_plus_the_new_tokens_exactly() -> None:
    assert ve.model_len([[5] * 320, [5] * 319], 64) == 384
    assert ve.model_len([[0]], 1) == 2


def test_the_environment_digest_depends_on_every_distribution_and_python_not_on_order() -> None:
    base = ve.environment_digest({"vllm": "0.26.0", "torch": "2.11.0"}, "3.12.3")
    assert base == ve.environment_digest({"torch": "2.11.0", "vllm": "0.26.0"}, "3.12.3")
    assert base == ve.environment_digest({"Torch": "2.11.0", "vllm": "0.26.0"}, "3.12.3")  # names as pip compares them
    assert base != ve.environment_digest({"vllm": "0.26.0", "torch": "2.11.1"}, "3.12.3")
    assert base != ve.environment_digest({"vllm": "0.26.0", "torch": "2.11.0", "xgrammar": "0.2.9"}, "3.12.3")
    assert base != ve.environment_digest({"vllm": "0.26.0", "torch": "2.11.0"}, "3.12.4")
    assert len(ve.environment_digest(ve.installed_distributions(), "3.11.7")) == 64


def test_selection_lines_are_parsed_with_prefixes_and_colour_codes() -> None:
    assert ve.parse_selection(CUTLASS_LOG) == [ve.KernelSelection("CutlassInt8ScaledMMLinearKernel", ve.INT8_SCHEME)]
    assert ve.parse_selection(TRITON_LOG) == [ve.KernelSelection("TritonInt8ScaledMMLinearKernel", ve.INT8_SCHEME)]
    assert ve.parse_selection("INFO Resolved architecture: Qwen3ForCausalLM\n") == []


def test_the_requested_kernel_is_verified_and_anything_else_refused() -> None:
    evidence = ve.verify_selection("vllm-cutlass", ve.parse_selection(CUTLASS_LOG), "cutlass.log")
    assert evidence["requested_kernel"] == "CutlassInt8ScaledMMLinearKernel"
    assert evidence["selected"] == ["CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"]
    assert evidence["environment"] == {ve.DISABLE_VAR: "unset"}
    assert ve.verify_selection("vllm-triton", ve.parse_selection(TRITON_LOG), "t.log")["environment"] == {
        ve.DISABLE_VAR: "CutlassInt8ScaledMMLinearKernel"}
    with pytest.raises(InputError, match="requested TritonInt8ScaledMMLinearKernel, but vLLM selected "
                                         "CutlassInt8ScaledMMLinearKernel"):
        ve.verify_selection("vllm-triton", ve.parse_selection(CUTLASS_LOG), "triton.log")
    with pytest.raises(InputError, match="no kernel selection for CompressedTensorsW8A8Int8"):
        ve.verify_selection("vllm-cutlass", ve.parse_selection("INFO nothing selected here\n"), "empty.log")
    mixed = CUTLASS_LOG + TRITON_LOG
    with pytest.raises(InputError, match="selected TritonInt8ScaledMMLinearKernel"):
        ve.verify_selection("vllm-cutlass", ve.parse_selection(mixed), "mixed.log")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None and torch.cuda.is_available(),
                    reason="vLLM and a GPU are present: the backend is available")
def test_without_vllm_or_a_gpu_the_backend_refuses_to_run(tmp_path: Path) -> None:
    ok, why = ve.available()
    assert not ok and why
    with pytest.raises(InputError, match="not available here"):
        ve.generate("vllm-cutlass", tmp_path, [[1, 2]], 2, tmp_path / "work")


def test_package_import_does_not_import_vllm() -> None:
    import int8alibi.engines  # noqa: F401

    assert "vllm" not in sys.modules
