"""The own engine's greedy decoding and teacher-forced scoring, against direct recomputation."""

from __future__ import annotations

import pytest
import torch

from int8alibi.engines.own import OwnEngine, cache_argument, greedy_steps
from int8alibi.errors import InputError
from int8alibi.model.synthetic import build_synthetic


@pytest.fixture(scope="module")
def engine() -> OwnEngine:
    """The tiny synthetic Qwen3 in float32 (a small vocabulary keeps it fast): recomputation and the
    KV-cache path then agree to ~1e-7, far below any argmax margin of these seeded weights."""
    model = build_synthetic("tiny", seed=0, vocab_size=512).float()
    return OwnEngine(model=model, tokenizer=None, info=None, device=torch.device("cpu"), label="tiny-f32")


def test_cache_argument_matches_this_transformers(engine: OwnEngine) -> None:
    import inspect

    assert cache_argument(engine.model) in inspect.signature(engine.model.forward).parameters


def test_greedy_generation_equals_full_recomputation_argmax(engine: OwnEngine) -> None:
    prompts = [[5, 17, 300, 2], [9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    out = engine.generate(prompts, 6, progress=False)
    assert [len(t) for t in out] == [6, 6, 6]
    with torch.inference_mode():
        for prompt, tokens in zip(prompts, out):
            full = torch.tensor([prompt + tokens])
            logits = engine.model(input_ids=full).logits[0]
            expected = logits[len(prompt) - 1: len(prompt) + 5].argmax(dim=-1).tolist()
            assert tokens == expected
    assert engine.generate(prompts, 6, progress=False) == out  # and it repeats itself


class _Scripted:
    """A stand-in model: each forward's last-position logits come from a script (ties included),
    and it records what it was fed and which cache it was handed."""

    def __init__(self, script: list[list[float]]) -> None:
        self.script, self.calls = script, []

    def forward(self, input_ids: torch.Tensor, use_cache: bool, past_key_values: object = None) -> object:
        self.calls.append((input_ids.tolist(), past_key_values))
        logits = torch.tensor(self.script[len(self.calls) - 1], dtype=torch.bfloat16)[None, None, :]
        return type("Out", (), {"logits": logits.expand(1, input_ids.shape[1], -1), "past_key_values": len(self.calls)})

    __call__ = forward


def test_greedy_steps_runs_one_forward_per_step_feeds_each_token_back_and_breaks_ties_low() -> None:
    model = _Scripted([[0.0, 3.0, 3.0, 1.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 7.0, 7.0], [9.0, 0.0, 0.0, 0.0]])
    steps = greedy_steps(model, torch.tensor([[4, 5, 6]]))
    assert model.calls == []  # nothing runs before the first step is asked for
    got = [next(steps) for _ in range(3)]
    assert [int(nxt) for _, nxt in got] == [1, 0, 2]  # every tie to the lowest id
    assert all(nxt.shape == (1,) and nxt.dtype == torch.int64 for _, nxt in got)
    assert [logits.tolist() for logits, _ in got] == model.script[:3]
    # three forwards for three tokens: the prompt, then each token with the cache the step before returned
    assert model.calls == [([[4, 5, 6]], None), ([[1]], 1), ([[0]], 2)]


def test_scoring_equals_cross_entropy_over_each_window(engine: OwnEngine) -> None:
    windows = torch.randint(0, 512, (3, 16), generator=torch.Generator().manual_seed(1))
    sums, tokens = engine.score(windows, progress=False)
    assert sums.dtype == torch.float64 and tokens.tolist() == [15, 15, 15]
    with torch.inference_mode():
        for w in range(3):
            logits = engine.model(input_ids=windows[w:w + 1]).logits[0, :-1].float()
            reference = torch.nn.functional.cross_entropy(logits, windows[w, 1:], reduction="sum")
            assert float(sums[w]) == pytest.approx(float(reference), rel=1e-6)


def test_bad_requests_are_refused(engine: OwnEngine) -> None:
    with pytest.raises(InputError, match="new_tokens must be >= 1"):
        engine.generate([[1, 2]], 0, progress=False)
    with pytest.raises(InputError, match=r"windows must be \[W, L >= 2\]"):
        engine.score(torch.zeros(3, 1, dtype=torch.int64), progress=False)



def test_a_shared_parent_lends_copies_that_equal_fresh_loads(tiny_pipeline) -> None:
    """Engines built from one ``SharedParent`` hold exactly a fresh load's tensors and give its logits,
    and swapping one copy's linears leaves the held parent (and so the next copy) untouched."""
    from int8alibi.engines.checkpoints import checkpoint_dir
    from int8alibi.engines.own import SharedParent, load_parent_engine, load_w8a8
    from int8alibi.kernels.registry import get

    _, cfg = tiny_pipeline("shared-parent", ["exact-cutlass-order", "exact-triton-order"])
    cpu = torch.device("cpu")
    gate = cfg.results / "requant" / "gate.parquet"
    arm = get("exact-cutlass-order", cpu)
    shared = SharedParent(cfg)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    for name in ("own", "pow2-nearest"):
        lent = load_w8a8(cfg, checkpoint_dir(gate, name), arm, cpu, name, shared=shared)
        fresh = load_w8a8(cfg, checkpoint_dir(gate, name), arm, cpu, name)
        with torch.inference_mode():
            got, want = lent.model(input_ids=ids).logits, fresh.model(input_ids=ids).logits
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    parent, fresh_parent = load_parent_engine(cfg, cpu, shared=shared), load_parent_engine(cfg, cpu)
    another = load_parent_engine(cfg, cpu, shared=shared).model
    assert parent.model is not another
    state, fresh_state = parent.model.state_dict(), fresh_parent.model.state_dict()
    assert state.keys() == fresh_state.keys()
    assert all(torch.equal(state[k], fresh_state[k]) for k in state)
    assert type(parent.model.get_submodule("model.layers.0.self_attn.q_proj")).__name__ == "PortableLinear"
    # a head tied in a fresh load stays tied in a copy, and two copies share no storage
    assert (parent.model.lm_head.weight is parent.model.model.embed_tokens.weight) == (
        fresh_parent.model.lm_head.weight is fresh_parent.model.model.embed_tokens.weight)
    other_ptrs = {t.data_ptr() for t in [*another.parameters(), *another.buffers()]}
    assert not other_ptrs & {t.data_ptr() for t in [*parent.model.parameters(), *parent.model.buffers()]}
    for engine in (lent, fresh):  # every projection replaced: nothing left on the meta device
        assert not [n for n, t in [*engine.model.named_parameters(), *engine.model.named_buffers()] if t.is_meta]


def test_a_copy_without_projections_holds_everything_else_and_their_shapes_only(tiny_pipeline) -> None:
    """``without_projections``: each projection's weight is a meta tensor of its shape and dtype (no
    bytes), every other tensor a full copy; swapping onto a named device materializes the W8A8 layers
    there, and one left meta is refused by name."""
    from int8alibi.engines.own import SharedParent
    from int8alibi.errors import InputError
    from int8alibi.model.layers import quantized_linears
    from int8alibi.model.w8a8 import quantize_linears, swap_linears
    from int8alibi.kernels.registry import get

    _, cfg = tiny_pipeline("shared-parent", ["exact-cutlass-order", "exact-triton-order"])
    shared = SharedParent(cfg)
    full, lean = shared.load()[0], shared.load(without_projections=True)[0]
    projections = {f"{ref.name}.weight" for ref in quantized_linears(full)}
    lean_state = dict(lean.named_parameters())
    for name, tensor in full.named_parameters():
        copy = lean_state[name]
        assert (copy.shape, copy.dtype) == (tensor.shape, tensor.dtype)
        assert copy.is_meta == (name in projections), name
        assert copy.is_meta or torch.equal(copy, tensor), name
    cpu = torch.device("cpu")
    checkpoint = quantize_linears(full, "none")
    with pytest.raises(InputError, match=r"model\.layers\.0\.self_attn\.q_proj: its weight was never materialized"):
        swap_linears(shared.load(without_projections=True)[0], checkpoint, get("exact-cutlass-order", cpu))
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    arm = get("exact-cutlass-order", cpu)
    with torch.inference_mode():
        got = swap_linears(lean, checkpoint, arm, cpu)(input_ids=ids).logits
        want = swap_linears(full, checkpoint, arm)(input_ids=ids).logits
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_shared_parent_copies_straight_to_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy for the GPU is made there tensor by tensor (the held parent stays on the CPU), and the
    copy with W8A8 layers on a real arm gives the logits of the same parent moved there whole."""
    from int8alibi.engines.own import SharedParent
    from int8alibi.kernels.registry import get
    from int8alibi.model import sources
    from int8alibi.model.w8a8 import quantize_linears, swap_linears

    def parent() -> torch.nn.Module:
        return build_synthetic("tiny", seed=0, vocab_size=512)

    monkeypatch.setattr(sources, "load_parent", lambda cfg: (parent(), None, None))
    cuda = torch.device("cuda")
    arm = get("cublaslt", cuda)
    shared = SharedParent(cfg=None)  # type: ignore[arg-type]  # the loader above takes no config
    lent = shared.load(cuda)[0]
    assert all(t.is_cuda for t in [*lent.parameters(), *lent.buffers()])
    assert all(t.device.type == "cpu" for t in shared.load()[0].parameters())
    assert lent.lm_head.weight is lent.model.embed_tokens.weight
    whole = parent().to(cuda)
    checkpoint = quantize_linears(parent(), "none")
    ids = torch.tensor([[3, 14, 15, 92, 65]], device=cuda)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    lean = swap_linears(shared.load(cuda, without_projections=True)[0], checkpoint, arm, cuda)
    peak = torch.cuda.max_memory_allocated() - before
    held = sum(t.numel() * t.element_size() for t in {id(t): t for t in [*lean.parameters(), *lean.buffers()]}.values())
    with torch.inference_mode():
        got = swap_linears(lent, checkpoint, arm)(input_ids=ids).logits
        want = swap_linears(whole, checkpoint, arm)(input_ids=ids).logits
        lean_logits = lean(input_ids=ids).logits
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(lean_logits.view(torch.int16), want.view(torch.int16))
    projections = sum(m.weight.numel() * 2 for m in parent().modules() if type(m).__name__ == "PortableLinear")
    assert peak < held + projections // 4, (peak, held)  # never the bf16 projections beside the int8 ones
