"""The trace: every intermediate of a forward at one position, in execution order, without changing
what the model computes; and the bitwise comparison of two traces."""

from __future__ import annotations

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.model.portable import make_portable
from int8alibi.model.synthetic import build_synthetic
from int8alibi.arith.bits import bits_equal
from int8alibi.model.trace import KINDS, Event, first_difference, traced
from int8alibi.model.w8a8 import quantize_linears, swap_linears



CPU = torch.device("cpu")
TINY_VOCAB = 256


@pytest.fixture(scope="module")
def w8a8_model() -> torch.nn.Module:
    model = make_portable(build_synthetic("tiny", seed=0, vocab_size=TINY_VOCAB)).eval()
    return swap_linears(model, quantize_linears(model), get("exact-cutlass-order", CPU))


def test_trace_names_every_module_kind_in_execution_order_and_changes_nothing(w8a8_model: torch.nn.Module) -> None:
    ids = torch.tensor([[5, 17, 99, 3, 42, 7]])
    with torch.inference_mode():
        plain = w8a8_model(input_ids=ids, use_cache=False).logits
        with traced(w8a8_model, row=4, position=4) as events:
            again = w8a8_model(input_ids=ids, use_cache=False).logits
    assert torch.equal(plain.view(torch.int16), again.view(torch.int16))
    kinds = [e.kind for e in events]
    assert set(kinds) == set(KINDS)
    assert kinds[0] == "embedding" and kinds[-2:] == ["head_input", "head"] and events[-3].name == "model.norm"
    blocks = 2  # the tiny preset
    assert kinds.count("linear_output") == 7 * blocks and kinds.count("linear_input") == 7 * blocks
    assert kinds.count("attention_scores") == kinds.count("softmax") == kinds.count("attention_output") == blocks
    block0 = [e.name for e in events if e.name == "model.layers.0" or e.name.startswith("model.layers.0.")]
    # attention: projections, then scores, softmax, probabilities times V, then the output projection
    order = [block0.index(n) for n in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.scores",
                                       "model.layers.0.self_attn.softmax", "model.layers.0.self_attn.output",
                                       "model.layers.0.self_attn.o_proj.input", "model.layers.0.mlp.act_fn",
                                       "model.layers.0.mlp.down_proj", "model.layers.0")]
    assert order == sorted(order)
    # rows: the traced position only; attention over the keys 0..position
    head = events[-1].value
    assert torch.equal(head.view(torch.int16), plain[0, 4].view(torch.int16))
    scores = next(e.value for e in events if e.kind == "attention_scores")
    softmax = next(e.value for e in events if e.kind == "softmax")
    assert scores.shape[-1] == 5 and softmax.dtype == torch.float32
    assert torch.allclose(softmax.sum(-1), torch.ones(softmax.shape[0]), atol=1e-6)
    # the hooks are gone afterwards
    with torch.inference_mode(), traced(w8a8_model, row=0, position=0) as later:
        pass
    assert later == []


def test_first_difference_names_the_first_event_and_refuses_different_module_sequences() -> None:
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    up = torch.nextafter(one.float(), torch.tensor([2.0])).to(torch.bfloat16)  # not one bf16 ulp: stays 1.0
    ulp = (one.view(torch.int16) + 1).view(torch.bfloat16)  # one bf16 ulp above 1.0
    assert torch.equal(up.view(torch.int16), one.view(torch.int16)) and not bits_equal(ulp, one)
    a = [Event("e", "embedding", one), Event("n", "norm", one), Event("h", "head", one)]
    b = [Event("e", "embedding", one), Event("n", "norm", ulp), Event("h", "head", ulp)]
    assert first_difference(a, b, "t") == 1 and first_difference(a, a, "t") is None
    with pytest.raises(InputError, match="t: the two traces ran different modules"):
        first_difference(a, b[:2], "t")
    with pytest.raises(InputError, match="event 1"):
        first_difference(a, [a[0], Event("m", "norm", one), a[2]], "t")
