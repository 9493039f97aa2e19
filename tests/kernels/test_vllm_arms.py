"""vLLM adapters without vLLM: argument layout, refusals, evidence, and the call plumbing via a stand-in."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.kernels import get
from int8alibi.kernels.exact import epilogue, kernel_accumulator
from int8alibi.kernels.vllm_arms import VLLM_FUNCTIONS, VllmArm, prepare_args, resolve

NO_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")


def operands(m=5, k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8),
            torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
            torch.rand(m, generator=g) * 0.1 + 1e-3, torch.rand(n, generator=g) * 1e-3 + 1e-4)


def test_prepare_args_layout():
    a_q, w_q, s_a, s_w = operands()
    args = prepare_args(a_q, w_q, s_a, s_w)
    assert args.a.shape == (5, 64) and args.a.is_contiguous() and args.a.dtype == torch.int8
    # b is the column-major [K,N] view of the stored [N,K] weight: no copy, strides (1, K).
    assert args.b.shape == (64, 48) and args.b.stride() == (1, 64) and args.b.t().is_contiguous()
    assert args.b.data_ptr() == w_q.data_ptr()
    assert args.scale_a.shape == (5, 1) and args.scale_a.is_contiguous() and args.scale_a.dtype == torch.float32
    assert args.scale_b.shape == (48, 1) and args.scale_b.is_contiguous() and args.scale_b.dtype == torch.float32
    assert args.out_dtype == torch.bfloat16
    assert torch.equal(args.b, w_q.t()) and torch.equal(args.scale_a[:, 0], s_a)


def test_prepare_args_makes_non_contiguous_weights_column_major():
    a_q, w_q, s_a, s_w = operands(k=128)
    sliced = w_q[:, ::2]  # [N, 64], stride (128, 2)
    args = prepare_args(a_q[:, :64].contiguous(), sliced, s_a, s_w)
    assert args.b.stride() == (1, 64) and torch.equal(args.b, sliced.t())


@pytest.mark.parametrize("k,n,what", [(40, 48, "K=40"), (64, 40, "N=40")])
def test_prepare_args_refuses_shapes_cutlass_would_reroute(k, n, what):
    a_q, w_q, s_a, s_w = operands(k=k, n=n)
    with pytest.raises(InputError, match=what):
        prepare_args(a_q, w_q, s_a, s_w, "vllm-cutlass")


def test_prepare_args_refuses_bad_scales():
    a_q, w_q, s_a, s_w = operands()
    with pytest.raises(InputError, match="s_a"):
        prepare_args(a_q, w_q, s_a.to(torch.float16), s_w)


@NO_VLLM
@pytest.mark.parametrize("kernel", ["cutlass", "triton"])
def test_unavailable_without_vllm(kernel):
    ok, why = VllmArm(kernel, "cuda").available()
    assert not ok and ("vLLM is not installed" in why or "CUDA" in why)
    ok, why = VllmArm(kernel, "cpu").available()
    assert not ok and "CUDA" in why
    with pytest.raises(InputError, match=VLLM_FUNCTIONS[kernel][0]):
        resolve(kernel)


@NO_VLLM
def test_evidence_without_vllm():
    ev = get("vllm-triton", "cpu").evidence()
    assert ev["arm"] == "vllm-triton" and ev["is_emulation"] is False and ev["epilogue_order"] == "triton"
    assert ev["versions"]["vllm"] == "absent"
    assert "compressed_tensors.triton_scaled_mm.triton_scaled_mm" in ev["implementation"]


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """Stand-in modules at vLLM's import paths that check the layout and compute each kernel's order."""
    calls = []

    def make(order):
        def fn(a, b, scale_a, scale_b, out_dtype):
            calls.append((a.shape, b.stride(), scale_a.shape, scale_b.shape, out_dtype))
            assert b.stride()[0] == 1 and scale_a.dim() == 2 and out_dtype is torch.bfloat16
            return epilogue(kernel_accumulator(a, b.t()), scale_a[:, 0], scale_b[:, 0], order)
        return fn

    for kernel, (module, attr) in VLLM_FUNCTIONS.items():
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setattr(sys.modules[module], attr, make(kernel), raising=False)
    return calls


@pytest.mark.parametrize("kernel", ["cutlass", "triton"])
def test_call_plumbing_through_a_stand_in(stand_in_vllm, kernel):
    a_q, w_q, s_a, s_w = operands()
    y = VllmArm(kernel, "cpu").scaled_mm(a_q, w_q, s_a, s_w)
    expected = get(f"exact-{kernel}-order", "cpu").scaled_mm(a_q, w_q, s_a, s_w)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert stand_in_vllm == [((5, 64), (1, 64), (5, 1), (48, 1), torch.bfloat16)]
    assert VllmArm(kernel, "cpu").accumulator(a_q, w_q) is None


def test_wrong_output_from_vllm_is_refused(monkeypatch, stand_in_vllm):
    module, attr = VLLM_FUNCTIONS["cutlass"]
    monkeypatch.setattr(sys.modules[module], attr, lambda *args: torch.zeros(2, 2))
    with pytest.raises(InputError, match="vllm-cutlass: returned"):
        VllmArm("cutlass", "cpu").scaled_mm(*operands())
