"""The operands a kernel sees for one linear layer, their safetensors files, and synthetic ones.

Every comparison in the project runs two arms on identical operands, so operands travel as one
unit (``Operands``) with a digest over their exact bytes, shapes and dtypes; a file whose tensors
no longer match their recorded digests is refused. ``synthetic_layers`` makes seeded operands of
real model shapes with realistic scale magnitudes, for kernel validation and benchmarks without a
model: a simple local generator, not the project's quantizer (that is ``int8alibi.quant``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import InputError
from .base import check_operands

META_KEY = "int8alibi.operands"
FILE_FORMAT = "int8alibi.operands/1"
TENSOR_NAMES = ("a_q", "s_a", "w_q", "s_w")


@dataclass(frozen=True)
class Operands:
    """One layer's kernel operands: a_q [M,K] int8, s_a [M] f32, w_q [N,K] int8, s_w [N] f32."""

    layer: str
    block: int
    proj: str
    a_q: torch.Tensor
    s_a: torch.Tensor
    w_q: torch.Tensor
    s_w: torch.Tensor

    def __post_init__(self) -> None:
        check_operands(self.a_q, self.w_q, self.s_a, self.s_w, f"operands of layer {self.layer!r}")

    @property
    def m(self) -> int:
        return self.a_q.shape[0]

    @property
    def k(self) -> int:
        return self.a_q.shape[1]

    @property
    def n(self) -> int:
        return self.w_q.shape[0]

    def to(self, device: torch.device | str) -> Operands:
        """The same operands on ``device``."""
        return Operands(
            self.layer, self.block, self.proj,
            *(getattr(self, name).to(device) for name in ("a_q", "s_a", "w_q", "s_w")),
        )


def operand_digest(op: Operands) -> str:
    """sha256 over the four tensors' names, dtypes, shapes and bytes (the layer name is not included)."""
    h = hashlib.sha256()
    for name in TENSOR_NAMES:
        t = getattr(op, name).detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy())
    return h.hexdigest()


def save_operands(path: Path | str, ops: list[Operands]) -> Path:
    """Write ``ops`` to one safetensors file (temporary file, then rename) with an index of digests."""
    path = Path(path)
    layers = [op.layer for op in ops]
    if len(set(layers)) != len(layers):
        raise InputError(f"{path}: duplicate layer names in operands to save")
    tensors: dict[str, torch.Tensor] = {}
    index = []
    for op in ops:
        for name in TENSOR_NAMES:
            tensors[f"{op.layer}:{name}"] = getattr(op, name).detach().contiguous().cpu()
        index.append({"layer": op.layer, "block": op.block, "proj": op.proj, "digest": operand_digest(op)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # One metadata key only: safetensors writes a multi-key metadata map in no fixed order, and
    # operand files must be byte-identical across identical runs.
    header = json.dumps({"format": FILE_FORMAT, "index": index}, sort_keys=True)
    save_file(tensors, str(tmp), metadata={META_KEY: header})
    os.replace(tmp, path)
    return path


def load_operands(path: Path | str, device: torch.device | str = "cpu") -> list[Operands]:
    """Read a file written by ``save_operands``; every layer's digest must match, nothing extra or missing."""
    path = Path(path)
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:
        raise InputError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    with handle as f:
        try:
            meta = json.loads((f.metadata() or {})[META_KEY])
            index = meta["index"]
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: operand index missing or not JSON (metadata key {META_KEY!r})") from exc
        if meta.get("format") != FILE_FORMAT:
            raise InputError(f"{path}: metadata format {meta.get('format')!r}, expected {FILE_FORMAT!r}")
        keys = set(f.keys())
        expected = {f"{entry['layer']}:{name}" for entry in index for name in TENSOR_NAMES}
        if keys != expected:
            detail = sorted(keys ^ expected)[:4]
            raise InputError(f"{path}: tensors do not match the index (first differences: {detail})")
        ops = []
        for entry in index:
            layer = entry["layer"]
            op = Operands(layer, int(entry["block"]), entry["proj"],
                          *(f.get_tensor(f"{layer}:{name}") for name in TENSOR_NAMES))
            if operand_digest(op) != entry["digest"]:
                raise InputError(f"{path}: layer {layer!r}: tensors do not match their recorded digest")
            ops.append(op.to(device))
    return ops


@dataclass(frozen=True)
class ModelShapes:
    """The linear layers of a decoder: ``blocks`` blocks of (module path, proj, K, N) each."""

    blocks: int
    projections: tuple[tuple[str, str, int, int], ...]

    def layers(self) -> list[tuple[str, int, str, int, int]]:
        """(layer name, block, proj, K, N) for every linear layer, in model order."""
        return [
            (f"model.layers.{b}.{module}.{proj}", b, proj, k, n)
            for b in range(self.blocks)
            for module, proj, k, n in self.projections
        ]


def _qwen3(blocks: int, hidden: int, kv: int, intermediate: int) -> ModelShapes:
    return ModelShapes(blocks, (
        ("self_attn", "q_proj", hidden, hidden),
        ("self_attn", "k_proj", hidden, kv),
        ("self_attn", "v_proj", hidden, kv),
        ("self_attn", "o_proj", hidden, hidden),
        ("mlp", "gate_proj", hidden, intermediate),
        ("mlp", "up_proj", hidden, intermediate),
        ("mlp", "down_proj", intermediate, hidden),
    ))


# Hidden size, K/V width (8 heads x 128), MLP width and depth of the study's models.
QWEN3_SHAPES: dict[str, ModelShapes] = {
    "qwen3-1.7b": _qwen3(28, 2048, 1024, 6144),
    "qwen3-8b": _qwen3(36, 4096, 1024, 12288),
    "qwen3-14b": _qwen3(40, 5120, 1024, 17408),
}

OUTLIER_FRACTION = 0.01  # share of activation channels with large magnitudes, as in real LLM activations
OUTLIER_GAIN = 20.0
WEIGHT_STD = 0.02


def _generator(*key: object) -> torch.Generator:
    """A CPU generator seeded from ``key``: a layer's operands do not depend on which others are made."""
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _activations(m: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 activations with per-token magnitudes and outlier channels, quantized by vLLM's per-token rule."""
    row_gain = torch.exp(0.5 * torch.randn(m, 1, generator=gen))
    x = torch.randn(m, k, generator=gen) * row_gain
    outliers = torch.randperm(k, generator=gen)[: max(1, int(k * OUTLIER_FRACTION))]
    x[:, outliers] *= OUTLIER_GAIN
    x = x.to(torch.bfloat16).to(torch.float32)
    absmax = x.abs().amax(dim=1)
    s_a = absmax / 127.0
    inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    a_q = torch.round(x * inv[:, None]).clamp(-128, 127).to(torch.int8)
    return a_q, s_a


def _weights(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """~N(0, 0.02) bf16 weights, per-channel scale absmax/127.5 in bf16, quotient rounded to bf16."""
    w = (torch.randn(n, k, generator=gen) * WEIGHT_STD).to(torch.bfloat16).to(torch.float32)
    s_w = (w.abs().amax(dim=1) / 127.5).to(torch.bfloat16).to(torch.float32)
    quotient = (w / s_w[:, None]).to(torch.bfloat16).to(torch.float32)
    w_q = torch.round(quotient.clamp(-128, 127)).to(torch.int8)
    return w_q, s_w


def synthetic_layers(
    shapes: str | ModelShapes = "qwen3-1.7b",
    m: int = 512,
    seed: int = 0,
    *,
    blocks: int | None = None,
    device: torch.device | str = "cpu",
) -> Iterator[Operands]:
    """Seeded operands for every linear layer of ``shapes`` (first ``blocks`` blocks only, if given).

    Generated on CPU (so the bytes do not depend on the device) and moved to ``device``. A layer's
    weights depend only on (seed, layer), its activations also on ``m``, so decode and prefill
    operands of one layer share their weights as in a real model.
    """
    if isinstance(shapes, str):
        if shapes not in QWEN3_SHAPES:
            raise InputError(f"synthetic_layers: unknown shapes {shapes!r} (known: {', '.join(QWEN3_SHAPES)})")
        shapes = QWEN3_SHAPES[shapes]
    if m < 1:
        raise InputError(f"synthetic_layers: m={m} must be >= 1")
    if blocks is not None and not 1 <= blocks <= shapes.blocks:
        raise InputError(f"synthetic_layers: blocks={blocks} outside [1, {shapes.blocks}]")
    for layer, block, proj, k, n in shapes.layers():
        if blocks is not None and block >= blocks:
            break
        yield synthetic_layer(layer, block, proj, k, n, m, seed, device)


def synthetic_layer(layer: str, block: int, proj: str, k: int, n: int, m: int, seed: int,
                    device: torch.device | str = "cpu") -> Operands:
    """One layer of ``synthetic_layers`` (a row of ``ModelShapes.layers()``): its own generators,
    so layers can be made in any order or in parallel with the same bytes."""
    a_q, s_a = _activations(m, k, _generator(seed, layer, "activations", m))
    w_q, s_w = _weights(n, k, _generator(seed, layer, "weights"))
    return Operands(layer, block, proj, a_q.to(device), s_a.to(device), w_q.to(device), s_w.to(device))
