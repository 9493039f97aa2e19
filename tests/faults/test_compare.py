"""``faults.compare``: the per-element facts on boundary bit patterns, and the Triton pass equal to the
tensor one (under ``TRITON_INTERPRET=1`` in a child process on CPU; on the GPU where there is one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from int8alibi.arith import ulp_distance
from int8alibi.arith.bf16 import signed_bits
from int8alibi.faults import compare

SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
           0x7FC0, 0xFFC0, 0x7F81, 0x7FFF]


def bf16(bits: list[int] | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(t >= 0x8000, t - 0x10000, t).to(torch.int16).view(torch.bfloat16)


def test_facts_match_the_checks_definitions_on_every_special_pair() -> None:
    a = bf16([x for x in SPECIAL for _ in SPECIAL])
    b = bf16([y for _ in SPECIAL for y in SPECIAL])
    differ, nfa, nfb, distance = compare.facts(signed_bits(a), signed_bits(b))
    assert torch.equal(differ, a.view(torch.int16) != b.view(torch.int16))
    assert torch.equal(nfa, ~torch.isfinite(a)) and torch.equal(nfb, ~torch.isfinite(b))
    assert torch.equal(distance, ulp_distance(a, b))


CHILD = textwrap.dedent(r'''
    import json, torch
    from int8alibi.faults.compare import whole_torch
    from int8alibi.faults.compare_triton import whole_triton
    special = torch.tensor(SPECIAL, dtype=torch.int64)
    g = torch.Generator().manual_seed(3)
    results = []
    for e in (1, 4096, 5000):
        ref = torch.randint(-32768, 32768, (2, 2, e), generator=g, dtype=torch.int64)
        out = ref[:, None].repeat(1, 3, 1, 1)
        flips = torch.rand(out.shape, generator=g) < 0.3
        out = torch.where(flips, torch.randint(-32768, 32768, out.shape, generator=g, dtype=torch.int64), out)
        if e >= 16:
            out[0, 0, 0, :16] = special
            out[1, 1, 1, :16] = special
        out[:, 2] = out[:, 2] ^ 1               # the lowest bit flipped everywhere
        to16 = lambda t: t.to(torch.int16).view(torch.bfloat16)
        a, b = to16(ref), to16(out)
        results.append(bool(torch.equal(whole_triton(a, b), whole_torch(a, b))))
    print(json.dumps(results))
''').replace("SPECIAL", repr([x - 0x10000 if x >= 0x8000 else x for x in SPECIAL]))


def test_triton_pass_equals_the_tensor_pass_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_pass_equals_the_tensor_pass_on_the_gpu() -> None:
    g = torch.Generator().manual_seed(4)
    ref = torch.randint(-32768, 32768, (3, 2, 70000), generator=g).to(torch.int16).view(torch.bfloat16)
    out = torch.randint(-32768, 32768, (3, 4, 2, 70000), generator=g).to(torch.int16).view(torch.bfloat16)
    out[:, 1] = ref
    out[0, 0, 0, :len(SPECIAL)] = bf16(SPECIAL)
    assert torch.equal(compare.whole(ref.cuda(), out.cuda()).cpu(), compare.whole_torch(ref, out))
