"""A user's ``module:function`` arm behind the guard: an exception, ``SystemExit``, a hang past the
time limit, a wrong output and a write into its input operands each end in one named
``UserArmError``; a well-behaved function gives its result, and the pipeline's operands are never
the ones it was handed."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from int8alibi.kernels import registry
from int8alibi.kernels.exact import ExactArm
from int8alibi.kernels.user_guard import UserArmError


def _operands():
    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-127, 128, (4, 32), dtype=torch.int8, generator=g)
    w_q = torch.randint(-128, 128, (16, 32), dtype=torch.int8, generator=g)
    s_a = torch.rand(4, generator=g) / 100 + 1e-3
    s_w = torch.rand(16, generator=g) / 100 + 1e-3
    return a_q, w_q, s_a, s_w


def _exact(a_q, w_q, s_a, s_w):
    return ExactArm("cutlass", torch.device("cpu")).scaled_mm(a_q, w_q, s_a, s_w)


def _spin(*_):
    while True:
        pass


def _swallow_everything(*_):
    while True:
        try:
            time.sleep(10)
        except Exception:  # the timer is not an Exception: this cannot keep the stage waiting
            pass


def _overwrite(a_q, w_q, s_a, s_w):
    out = _exact(a_q, w_q, s_a, s_w)
    a_q.zero_()  # a plausible table would follow from the zeroed operands
    return out


FUNCTIONS = {
    "good": _exact,
    "raises": lambda *_: (_ for _ in ()).throw(ValueError("bad kernel")),
    "exits": lambda *_: sys.exit(0),
    "spins": _spin,
    "sleeps": _swallow_everything,
    "overwrites": _overwrite,
    "float32": lambda a_q, w_q, s_a, s_w: _exact(a_q, w_q, s_a, s_w).float(),
}


@pytest.fixture
def user_module(monkeypatch):
    module = types.ModuleType("user_arms_fixture")
    for name, fn in FUNCTIONS.items():
        setattr(module, name, fn)
    monkeypatch.setitem(sys.modules, "user_arms_fixture", module)
    return module


def arm(name: str, limit: float = 0.3):
    return registry.get(f"user_arms_fixture:{name}", "cpu", user_time_limit_s=limit)


def test_a_well_behaved_user_arm_gives_its_result_and_keeps_the_operands(user_module):
    ops = _operands()
    kept = tuple(t.clone() for t in ops)
    assert torch.equal(arm("good").scaled_mm(*ops), _exact(*ops))
    assert all(torch.equal(a, b) for a, b in zip(ops, kept))


@pytest.mark.parametrize("name, words", [
    ("raises", "raised ValueError: bad kernel"),
    ("exits", "called SystemExit(0) instead of returning a result"),
    ("spins", "did not return within its time limit of 0.3 s"),
    ("sleeps", "did not return within its time limit of 0.3 s"),
    ("overwrites", "wrote into its input operand(s) a_q"),
    ("float32", "returned torch.float32 (4, 16), expected torch.bfloat16 [4, 16]"),
])
def test_a_misbehaving_user_arm_is_one_named_error(user_module, name, words):
    ops = _operands()
    kept = tuple(t.clone() for t in ops)
    started = time.monotonic()
    with pytest.raises(registry.InputError) as caught:
        arm(name).scaled_mm(*ops)
    assert f"user arm user_arms_fixture:{name}: " in str(caught.value) and words in str(caught.value)
    assert time.monotonic() - started < 5
    assert all(torch.equal(a, b) for a, b in zip(ops, kept))  # the pipeline's own operands are untouched
    if name != "float32":
        assert isinstance(caught.value, UserArmError)


def test_a_user_module_that_exits_on_import_is_named(monkeypatch, tmp_path):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.InputError, match="cannot import module exits_on_import: SystemExit: 3"):
        registry.get("exits_on_import:f", "cpu")
