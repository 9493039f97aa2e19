"""Arm names, the auto choice and its evidence, explicit pairs, and user-supplied arms."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.kernels import ARM_NAMES, Arm, get, select
from int8alibi.kernels.base import EMULATION_NOTE

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only choice")


@pytest.mark.parametrize("name", ARM_NAMES)
def test_every_name_builds_an_arm(name):
    arm = get(name, "cpu")
    assert isinstance(arm, Arm) and arm.name == name
    ok, why = arm.available()
    assert isinstance(ok, bool) and why


def test_unknown_name_is_refused():
    with pytest.raises(InputError, match="unknown kernel arm 'cutlass'"):
        get("cutlass", "cpu")


def test_auto_on_cpu_takes_the_exact_pair_and_says_why():
    a, b, ev = select("auto", "cpu")
    assert (a.name, b.name) == ("exact-cutlass-order", "exact-triton-order")
    assert ev["chosen"] == ["exact-cutlass-order", "exact-triton-order"] and ev["emulation"] is True
    assert ev["device"] == "cpu" and "auto" in ev["why"]
    assert set(ev["unavailable"]) == {"vllm-cutlass", "vllm-triton", "cublaslt", "triton"}
    assert all(reason for reason in ev["unavailable"].values())
    assert [arm["note"] for arm in ev["arms"]] == [EMULATION_NOTE, EMULATION_NOTE]


@NO_GPU
def test_auto_on_cuda_without_a_gpu_finds_no_pair():
    with pytest.raises(InputError, match="no pair available"):
        select("auto", "cuda")


def test_explicit_pair_fails_closed_naming_the_arm():
    with pytest.raises(InputError, match="cublaslt: cublaslt needs a CUDA device"):
        select(["cublaslt", "exact-triton-order"], "cpu")
    a, b, ev = select(["exact-triton-order", "exact-cutlass-order"], "cpu")
    assert (a.name, b.name) == ("exact-triton-order", "exact-cutlass-order") and ev["unavailable"] == {}


@pytest.mark.parametrize("spec", ["bogus", ["exact-cutlass-order"], ["a", "b", "c"]])
def test_malformed_specs_are_refused(spec):
    with pytest.raises(InputError):
        select(spec, "cpu")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_kernels.py").write_text(textwrap.dedent('''
        import torch
        from int8alibi.kernels.exact import epilogue, kernel_accumulator

        def scaled_mm(a_q, w_q, s_a, s_w):
            return epilogue(kernel_accumulator(a_q, w_q), s_a, s_w, "triton")

        def wrong_dtype(a_q, w_q, s_a, s_w):
            return torch.zeros(a_q.shape[0], w_q.shape[0])
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_kernels"
    sys.modules.pop("my_kernels", None)


def test_user_function_as_arm(user_module):
    a, b, ev = select(["exact-cutlass-order", f"{user_module}:scaled_mm"], "cpu")
    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-128, 128, (3, 32), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (8, 32), generator=g, dtype=torch.int8)
    s_a, s_w = torch.rand(3, generator=g), torch.rand(8, generator=g)
    ref = get("exact-triton-order", "cpu").scaled_mm(a_q, w_q, s_a, s_w)
    assert torch.equal(b.scaled_mm(a_q, w_q, s_a, s_w).view(torch.int16), ref.view(torch.int16))
    user_ev = ev["arms"][1]
    assert user_ev["user_supplied"] is True and "user-supplied" in user_ev["implementation"]
    assert "my_kernels.py" in user_ev["implementation"]
    with pytest.raises(InputError, match="returned torch.float32"):
        get(f"{user_module}:wrong_dtype", "cpu").scaled_mm(a_q, w_q, s_a, s_w)


@pytest.mark.parametrize("spec,match", [("no_such_module_xyz:f", "cannot import"), ("math:no_such", "no callable"),
                                        (":f", "module:function")])
def test_bad_user_arms_are_refused(spec, match):
    with pytest.raises(InputError, match=match):
        get(spec, "cpu")


def test_importing_the_package_needs_neither_triton_nor_vllm():
    code = ("import sys, int8alibi.kernels, int8alibi.kernels.layer_operands; "
            "from int8alibi.kernels import select; select('auto', 'cpu'); "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_operand_check_cache_runs_a_check_once_per_operand_set_and_never_remembers_a_failure():
    from int8alibi.kernels.base import OperandCheckCache

    cache, calls = OperandCheckCache(), []
    a, w = torch.zeros(4, 8, dtype=torch.int8), torch.zeros(2, 8, dtype=torch.int8)
    for _ in range(3):
        cache.once((a, w), lambda: calls.append("a,w"))
    cache.once((a, w.t()), lambda: calls.append("a,w.t"))  # other strides: checked again
    assert calls == ["a,w", "a,w.t"]

    def failing() -> None:
        raise InputError("bad operands")

    for _ in range(2):
        with pytest.raises(InputError):
            cache.once((w, a), failing)
