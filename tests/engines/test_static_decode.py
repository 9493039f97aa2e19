"""Static-cache decode steps replayed as CUDA graphs against the model's own eager dynamic-cache steps,
bit for bit (the GPU tests), and the dispatch that keeps the CPU on the dynamic cache."""

from __future__ import annotations

import pytest
import torch

from int8alibi.engines.own import ENGINE, engine_record, greedy_steps
from int8alibi.errors import InputError
from int8alibi.model.synthetic import build_synthetic

PROMPT = [5, 17, 200, 2, 9, 31]
STEPS = 12


def _steps(model: torch.nn.Module, device: str, new_tokens: int | None,
           **kw: bool) -> tuple[list[torch.Tensor], list[int]]:
    with torch.inference_mode():
        steps = greedy_steps(model, torch.tensor([PROMPT], device=device), new_tokens, **kw)
        pairs = [next(steps) for _ in range(STEPS)]
    return [logits.cpu() for logits, _ in pairs], [int(nxt) for _, nxt in pairs]


def test_the_cpu_keeps_the_dynamic_cache_whatever_the_caller_knows() -> None:
    model = build_synthetic("tiny", seed=0, vocab_size=256)
    dynamic, known, eager = (_steps(model, "cpu", n, **kw) for n, kw in ((None, {}), (STEPS, {}), (STEPS, {"graph": False})))
    assert dynamic[1] == known[1] == eager[1]
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(dynamic[0], known[0], eager[0]))
    assert engine_record(torch.device("cpu")) == ENGINE
    assert "CUDA graphs" in engine_record(torch.device("cuda"))["decoding"]


def _w8a8_cuda(arm_name: str) -> torch.nn.Module:
    from int8alibi.kernels.registry import get
    from int8alibi.model.w8a8 import quantize_linears, swap_linears

    model = build_synthetic("tiny", seed=0, vocab_size=256).cuda()
    return swap_linears(model, quantize_linears(model, "none"), get(arm_name, "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("arm_name", ["cublaslt", "triton"])
def test_graph_steps_are_the_eager_steps_bit_for_bit(arm_name: str) -> None:
    model = _w8a8_cuda(arm_name)
    dynamic = _steps(model, "cuda", None)
    eager_static = _steps(model, "cuda", STEPS, graph=False)
    graphed = _steps(model, "cuda", STEPS)
    again = _steps(model, "cuda", STEPS)  # a second cache and capture
    assert graphed[1] == eager_static[1] == dynamic[1] == again[1]
    for name, other in (("the eager static-cache steps", eager_static), ("the dynamic cache's", dynamic),
                        ("a second capture", again)):
        assert all(torch.equal(a, b) for a, b in zip(graphed[0], other[0])), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_a_non_finite_input_stops_a_replayed_step_naming_the_layer() -> None:
    from int8alibi.model.w8a8 import W8A8Linear

    model = _w8a8_cuda("triton")
    first = next(m for m in model.modules() if isinstance(m, W8A8Linear))
    scale = torch.ones((), device="cuda", dtype=torch.bfloat16)
    first.register_forward_pre_hook(lambda mod, args: (args[0] * scale,))  # captured with the graph
    with torch.inference_mode():
        steps = greedy_steps(model, torch.tensor([PROMPT], device="cuda"), STEPS)
        next(steps), next(steps)  # the prompt, then the first replayed step: finite
        scale.fill_(float("nan"))  # the graph reads this tensor: the next replay's input is NaN
        with pytest.raises(InputError, match=rf"^{first.name} input: \d+ non-finite element\(s\)"):
            next(steps)


def test_the_eager_static_cache_steps_with_their_own_mask_are_the_dynamic_cache_steps_on_the_cpu() -> None:
    """The static-cache step (the graph's eager body: a 4-D mask written before each step) run on
    the CPU against the dynamic cache's steps, bit for bit, for the tiny model."""
    from int8alibi.engines.own import cache_argument
    from int8alibi.engines.static_decode import static_steps

    model = build_synthetic("tiny", seed=0, vocab_size=256)
    dynamic = _steps(model, "cpu", None)
    with torch.inference_mode():
        steps = static_steps(model, torch.tensor([PROMPT]), STEPS, cache_argument(model), graph=False)
        pairs = [next(steps) for _ in range(STEPS)]
    assert [int(n) for _, n in pairs] == dynamic[1]
    assert all(torch.equal(a, b) for (a, _), b in zip(pairs, dynamic[0]))
