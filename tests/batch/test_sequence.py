"""Sequence-level batch invariance on a tiny synthetic model: left padding, the seeded batches, the
comparison with the prompt alone, and a planted batch-dependent module found and named."""

from __future__ import annotations

import pytest
import torch

from int8alibi.batch.sequence import PAD_ID, batches_of, first_step, generate, left_padded, sequence_rows
from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.model.portable import make_portable
from int8alibi.model.synthetic import build_synthetic
from int8alibi.model.w8a8 import quantize_linears, swap_linears

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 42], [7, 8], [200, 1, 2], [9, 9, 9, 9]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = make_portable(build_synthetic("tiny", seed=0, vocab_size=256)).eval()
    return swap_linears(m, quantize_linears(m), get("exact-cutlass-order", CPU))


def test_left_padding_right_aligns_every_prompt() -> None:
    ids, mask, pads = left_padded([[1, 2, 3], [4]], CPU)
    assert ids.tolist() == [[1, 2, 3], [PAD_ID, PAD_ID, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pads == [0, 2]
    with pytest.raises(InputError, match="at least one token"):
        left_padded([[1], []], CPU)


def test_batches_are_a_seeded_order_cut_in_groups_and_a_short_last_one_is_filled() -> None:
    four = batches_of(4, 2, seed=11)
    assert sorted(i for b in four for i in b) == [0, 1, 2, 3] and all(len(b) == 2 for b in four)
    assert four == batches_of(4, 2, seed=11)
    filled = batches_of(3, 2, seed=11)
    assert sorted(i for b in filled for i in b) == [0, 1, 2, 3]   # prompt 3 fills the last batch
    assert batches_of(1, 2, seed=0) == [[0, 1]]


def test_first_step_is_the_first_row_that_differs_in_any_bit() -> None:
    a = torch.zeros(4, 3, dtype=torch.bfloat16)
    b = a.clone()
    assert first_step(a, b) is None
    b[2, 1] = -0.0   # -0 against +0: bits differ
    assert first_step(a, b) == 2


def test_a_batch_of_one_is_the_prompt_alone_and_greedy(model) -> None:
    one = generate(model, [PROMPTS[0]], 4)
    again = generate(model, [PROMPTS[0]], 4)
    assert one.logits.shape == (1, 4, 256) and one.pads == [0]
    assert torch.equal(one.logits.view(torch.int16), again.logits.view(torch.int16))
    assert one.logits[0].argmax(-1).tolist() == one.tokens[0]
    with pytest.raises(InputError, match="new_tokens must be >= 1"):
        generate(model, [PROMPTS[0]], 0)


def test_rows_record_each_prompt_in_its_batch_against_itself_alone(model) -> None:
    rows = sequence_rows(model, "own", "exact-cutlass-order", PROMPTS, 4, 3, [2, 4], seed=5)
    assert len(rows) == 8
    assert sorted((r["batch_size"], r["prompt"]) for r in rows) == [(n, p) for n in (2, 4) for p in range(4)]
    for r in rows:
        assert r["steps"] == 3
        assert r["pad"] == max(len(PROMPTS[q]) for q in batches_of(4, r["batch_size"], 5 + r["batch_size"])[r["batch"]]) \
            - len(PROMPTS[r["prompt"]])
        if r["identical"]:
            assert r["first_step"] is None and r["module"] is None and r["first_token_step"] is None
        else:  # where this CPU's kernels do depend on the batch, the first differing module is named
            assert r["module"] is not None and 0 <= r["first_step"] < 3


def test_a_module_that_changes_with_the_batch_is_found_and_named(model) -> None:
    target = "model.layers.1.mlp.down_proj"

    def one_ulp_in_batches(module, args, out):
        if out.shape[0] == 1:
            return out
        return (out.contiguous().view(torch.int16) + 1).view(torch.bfloat16)

    handle = model.get_submodule(target).register_forward_hook(one_ulp_in_batches)
    try:
        rows = sequence_rows(model, "own", "arm", PROMPTS[:2], 2, 3, [2], seed=1)
    finally:
        handle.remove()
    assert [r["identical"] for r in rows] == [False, False]
    assert all(r["first_step"] == 0 and r["module"] == target and r["module_kind"] == "linear_output" for r in rows)
    assert all(0 < r["module_index"] < r["traced"] for r in rows)
