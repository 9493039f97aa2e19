"""Prefill versus decode: the per-position comparison on hand-made logits, decode as the own engine
does it, and the attribution finding a one-ulp divergence injected into one module of the decode
path only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from int8alibi.engines.own import OwnEngine
from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.model.portable import make_portable
from int8alibi.model.synthetic import build_synthetic
from int8alibi.model.w8a8 import quantize_linears, swap_linears
from int8alibi.engines.prefill_decode import attribute, decode, first_differing, positions, prefill

CPU = torch.device("cpu")
PROMPT = [5, 17, 99, 3, 42]
NEW = 5


def bf16(rows: list[list[float]]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float64)
    out = t.to(torch.bfloat16)
    assert torch.equal(out.double().nan_to_num(7.0), t.nan_to_num(7.0)), "test values must be bf16-exact"
    return out


def test_flips_and_bitwise_differences_on_constructed_logits() -> None:
    decoded = bf16([[1.0, 3.0, 3.0, 0.0],     # tie: top-1 is the lowest id (1)
                    [1.0, 3.0, 3.0, 0.0],     # tie
                    [0.5, 2.0, 1.0, -1.0],
                    [0.5, 2.0, 1.0, -1.0],
                    [0.0, 2.0, 1.0, 0.0],
                    [0.0, -0.0, 1.0, 0.0]])
    prefilled = bf16([[1.0, 3.0, 3.0, 0.5],   # the tie kept, another logit moved: differs, no flip
                      [1.0, 3.0, 3.015625, 0.0],  # the tie broken the other way by one bf16 spacing: a flip
                      [0.5, 2.0, 1.0, -1.0],  # identical
                      [0.5, 1.0, 2.0, -1.0],  # the top two swapped: a flip
                      [0.0, 2.0, float("nan"), 0.0],  # a NaN lower than nothing: argmax takes NaN, a flip
                      [0.0, 0.0, 1.0, 0.0]])  # -0 against +0: bits differ, top-1 the same
    p = positions(decoded, prefilled)
    assert p.flip.tolist() == [False, True, False, True, True, False]
    assert p.differ.tolist() == [True, True, False, True, True, True]
    assert p.top1_a.tolist() == [1, 1, 1, 1, 1, 2] and p.top1_b.tolist() == [1, 2, 1, 2, 2, 2]
    assert first_differing(p.differ) == 0 and first_differing(np.zeros(4, bool)) is None
    assert first_differing(np.array([False, False, True, True])) == 2


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = make_portable(build_synthetic("tiny", seed=0, vocab_size=256)).eval()
    return swap_linears(m, quantize_linears(m), get("exact-cutlass-order", CPU))


def test_decode_is_the_own_engines_greedy_decoding_and_prefill_covers_every_generated_position(model) -> None:
    tokens, decoded, trace = decode(model, PROMPT, NEW)
    engine = OwnEngine(model=model, tokenizer=None, info=None, device=CPU, label="tiny")
    assert engine.generate([PROMPT], NEW, progress=False) == [tokens] and trace == []
    assert decoded.shape == (NEW, 256) and decoded.dtype == torch.bfloat16
    assert decoded.argmax(-1).tolist() == tokens
    prefilled, _ = prefill(model, PROMPT, tokens)
    assert prefilled.shape == decoded.shape
    # position 0 of the prefill is the prompt's last row: the same as a forward over the prompt alone
    # when the replay adds no rows (one generated token)
    alone, _ = prefill(model, PROMPT, tokens[:1])
    assert torch.equal(alone[0].view(torch.int16), decoded[0].view(torch.int16))
    with pytest.raises(InputError, match="non-empty prompt"):
        decode(model, [], 3)
    with pytest.raises(InputError, match="non-empty prompt"):
        prefill(model, PROMPT, [])
    # stop: the first steps of the same decode (the cache sized for all of them), nothing else
    first, rows, _ = decode(model, PROMPT, NEW, stop=2)
    assert first == tokens[:2] and torch.equal(rows.view(torch.int16), decoded[:2].view(torch.int16))
    for bad in (0, NEW + 1):
        with pytest.raises(InputError, match=f"stop={bad} outside 1..{NEW}"):
            decode(model, PROMPT, NEW, stop=bad)


def one_ulp_up(row_sizes: set[int]):
    """A forward hook that moves every element of the last row up by one bf16 spacing (toward +inf for
    positive values, by the bits) in passes whose sequence length is in ``row_sizes``."""

    def hook(module, args, out):
        if out.shape[1] not in row_sizes:
            return out
        out = out.clone()
        last = out[:, -1].contiguous()
        out[:, -1] = (last.view(torch.int16) + 1).view(torch.bfloat16)
        return out

    return hook


@pytest.mark.parametrize("module_name,kind", [("model.layers.1.self_attn.o_proj", "linear_output"),
                                              ("model.norm", "norm"),
                                              ("model.layers.0.mlp.act_fn", "activation")])
def test_attribution_names_a_module_perturbed_by_one_ulp_in_the_decode_path_only(model, module_name, kind) -> None:
    tokens, _, _ = decode(model, PROMPT, NEW)
    replay_rows = len(PROMPT) + NEW - 1   # the prefill pass; decode passes have len(PROMPT) or 1 rows
    handle = model.get_submodule(module_name).register_forward_hook(one_ulp_up({len(PROMPT), 1}))
    try:
        perturbed, decoded, _ = decode(model, PROMPT, NEW)
        prefilled, _ = prefill(model, PROMPT, perturbed)
        p = positions(decoded, prefilled)
        first = first_differing(p.differ)
        assert first is not None and replay_rows > len(PROMPT)
        d = attribute(model, PROMPT, perturbed, first, decoded, prefilled, where="tiny")
    finally:
        handle.remove()
    assert (d.module, d.kind, d.position) == (module_name, kind, first)
    assert 0 < d.index < d.events - 1


def test_attribution_refuses_a_position_whose_logits_do_not_differ(model) -> None:
    tokens, decoded, _ = decode(model, PROMPT, NEW)
    prefilled, _ = prefill(model, PROMPT, tokens)
    equal = np.flatnonzero(~positions(decoded, prefilled).differ)
    if equal.size == 0:
        pytest.skip("every position's logits differ on this host: no equal position to refuse")
    clean = int(equal[0])
    with pytest.raises(InputError, match="no traced intermediate does"):
        attribute(model, PROMPT, tokens, clean, decoded, prefilled, where="tiny")
    wrong = decoded.clone()
    wrong[clean, 0] = (wrong[clean, 0].view(torch.int16) + 1).view(torch.bfloat16)
    with pytest.raises(InputError, match="traced decode did not reproduce"):
        attribute(model, PROMPT, tokens, clean, wrong, prefilled, where="tiny")
