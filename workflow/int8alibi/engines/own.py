"""The project's own engine: the model's bf16 code, with W8A8 linears run through a kernel arm.

Attention, norms, embeddings and the LM head stay the Hugging Face model's own bf16 code; only
the linear layers a checkpoint quantizes are swapped for W8A8 modules that call the selected arm.
So two arms differ only inside the scaled GEMM, which is the treatment under study. Every
sequence is processed alone (batch of one, fixed shapes), so no result depends on what it was
batched with.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..config import Config
from ..errors import InputError
from ..progress import Progress

ENGINE = {"name": "int8alibi-own", "version": __version__, "decoding": "greedy argmax, batch of one, KV cache"}


def engine_record(device: torch.device) -> dict[str, Any]:
    """``ENGINE`` as an identity records it: on CUDA the decode steps run over a static cache as CUDA
    graphs (``engines.static_decode``), which the record says."""
    if device.type != "cuda":
        return dict(ENGINE)
    return {**ENGINE, "decoding": "greedy argmax, batch of one, static KV cache, decode steps as CUDA graphs"}


@dataclass
class OwnEngine:
    """A loaded model on its device, its tokenizer, and what it is (parent or W8A8 under an arm)."""

    model: Any
    tokenizer: Any
    info: Any
    device: torch.device
    label: str

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], new_tokens: int, *, progress: bool = True) -> list[list[int]]:
        """Greedy decoding: exactly ``new_tokens`` argmax tokens after each prompt (EOS not special).

        Ties in the argmax go to the lowest token id (torch.argmax returns the first maximum).
        """
        if new_tokens < 1:
            raise InputError(f"{self.label}: new_tokens must be >= 1, got {new_tokens}")
        out: list[list[int]] = []
        bar = Progress(total=len(prompts) * new_tokens, desc=f"generate {self.label}", unit="tok", disable=not progress)
        for prompt in prompts:
            steps = greedy_steps(self.model, torch.tensor([list(prompt)], dtype=torch.int64, device=self.device),
                                 new_tokens)
            tokens: list[torch.Tensor] = []
            for _ in range(new_tokens):
                tokens.append(next(steps)[1])
                bar.update(1)
            out.append(torch.cat(tokens).tolist())
        bar.close()
        return out

    @torch.inference_mode()
    def score(self, windows: torch.Tensor, *, progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced NLL per window: ``(nll_sum float64 [W], scored tokens int64 [W])``.

        Every token after a window's first is scored on the window's own prefix; the bf16 logits
        are widened to float32 for the log-softmax and per-window sums are taken in float64.
        """
        if windows.dim() != 2 or windows.shape[1] < 2:
            raise InputError(f"{self.label}: windows must be [W, L >= 2] token ids, got {tuple(windows.shape)}")
        sums = torch.empty(windows.shape[0], dtype=torch.float64)
        for w in Progress(range(windows.shape[0]), desc=f"score {self.label}", unit="window", disable=not progress):
            ids = windows[w:w + 1].to(self.device)
            logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            nll = -logp.gather(1, ids[0, 1:, None]).squeeze(1)
            if not bool(torch.isfinite(nll).all()):
                raise InputError(f"{self.label}: window {w} has a non-finite token NLL")
            sums[w] = nll.double().sum().cpu()
        return sums, torch.full((windows.shape[0],), windows.shape[1] - 1, dtype=torch.int64)


def cache_argument(model: Any) -> str:
    """The name under which this transformers version passes the KV cache in and out of forward
    (``cache`` from transformers 5.x, ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def greedy_steps(model: Any, prompt_ids: torch.Tensor, new_tokens: int | None = None, *,
                 graph: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Greedy KV-cache decoding of a batch of one, one forward per ``next()``: the first runs the
    prompt ``[1, P]``, each later one the token yielded before it. Yields the newest position's
    logits ``[V]`` and its argmax ``[1]`` (int64, on the model's device: nothing is read back).

    Ties in the argmax go to the lowest token id (torch.argmax returns the first maximum). A caller
    that wraps ``next()`` in a context (a trace, operand taps) wraps exactly that step's forward.
    On CUDA, a caller that knows its ``new_tokens`` gets the static-cache steps of
    ``engines.static_decode`` (replayed as CUDA graphs unless ``graph=False``, which a traced step
    needs); on the CPU, and without ``new_tokens``, the model's own dynamic cache.
    """
    cache = cache_argument(model)
    if new_tokens is not None and prompt_ids.is_cuda:
        from .static_decode import static_steps

        yield from static_steps(model, prompt_ids, new_tokens, cache, graph=graph)
        return
    step = model(input_ids=prompt_ids, use_cache=True)
    while True:
        logits = step.logits[0, -1]
        nxt = logits.argmax(dim=-1, keepdim=True)
        yield logits, nxt
        step = model(input_ids=nxt[None, :], use_cache=True, **{cache: getattr(step, cache)})


class SharedParent:
    """The bf16 parent loaded once in a process and lent out as fresh deep copies, one per engine.

    A stage that builds several engines (prefill_decode: every checkpoint on both arms; perplexity;
    capture; tokens) otherwise pays transformers' load and the file checks per engine. Each copy
    holds the loaded model's own parameters and buffers, copied, so an engine is what a fresh load
    gives. The original stays on the CPU, untouched, for the stage's lifetime (one parent's bytes);
    a copy for a GPU is made there tensor by tensor, with no second host copy in between.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._loaded: tuple[Any, Any, Any] | None = None

    def load(self, device: torch.device | None = None, *, without_projections: bool = False) -> tuple[Any, Any, Any]:
        """``(model copy on device, tokenizer, info)`` as ``model.sources.load_parent`` returns them
        (default device: the CPU). ``without_projections``: the projections' weights are shapes on the
        meta device, not copied, for a caller that replaces them at once (``load_w8a8``): the device
        then never holds the bf16 parent and the checkpoint together."""
        from ..model.layers import quantized_linears
        from ..model.sources import load_parent as _load

        if self._loaded is None:
            self._loaded = _load(self.cfg)
        model, tokenizer, info = self._loaded
        target = torch.device("cpu") if device is None else device
        skipped = {id(model.get_submodule(ref.name).weight) for ref in quantized_linears(model)} \
            if without_projections else set()
        # deepcopy consults its memo first: every parameter and buffer (a tied one once) is copied
        # straight to the target; the module tree and everything else is deep-copied as usual.
        memo: dict[int, Any] = {id(p): nn.Parameter(p.detach().to("meta" if id(p) in skipped else target, copy=True),
                                                    requires_grad=p.requires_grad)
                                for p in model.parameters()}
        memo.update({id(b): b.detach().to(target, copy=True) for b in model.buffers()})
        return copy.deepcopy(model, memo), tokenizer, info


def load_parent_engine(cfg: Config, device: torch.device, *, shared: SharedParent | None = None) -> OwnEngine:
    """The bf16 parent model, untouched: the reference arm of the perplexity stage. With ``shared``,
    a copy of the parent it holds (loaded on first use) instead of a load of its own."""
    from ..model.sources import load_parent as _load

    model, tokenizer, info = shared.load(device) if shared is not None else _load(cfg)
    model = model.to(device).eval()
    return OwnEngine(model=model, tokenizer=tokenizer, info=info, device=device, label="parent")


def load_w8a8(cfg: Config, checkpoint_dir: Path, arm: Any, device: torch.device, label: str, *,
              shared: SharedParent | None = None) -> OwnEngine:
    """A fresh parent (``shared``: a fresh copy of it) with its quantized linears replaced by the
    checkpoint's W8A8 layers on ``arm``."""
    from ..model.w8a8 import swap_linears
    from ..quant.compressed_tensors import load_checkpoint

    from ..model.sources import load_parent as _load

    checkpoint = load_checkpoint(checkpoint_dir)
    # the projections are replaced before anything reaches the device: it holds the checkpoint's
    # int8 layers and the parent's other tensors, never the bf16 projections beside them
    model, tokenizer, info = shared.load(device, without_projections=True) if shared is not None else _load(cfg)
    model = swap_linears(model, checkpoint, arm, device).to(device).eval()
    return OwnEngine(model=model, tokenizer=tokenizer, info=info, device=device, label=label)
