"""The quantized linears of a decoder, in one stable order: block, then q, k, v, o, gate, up, down.

Every stage that walks layers (requant, capture, compare, faults) uses this order and these
names, so rows line up across tables. A layer is named by its module path in the model
(``model.layers.3.mlp.down_proj``), which is also its tensor prefix in a checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from ..errors import InputError

PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_NAME = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(self_attn|mlp)\.(" + "|".join(PROJECTIONS) + r")$")


@dataclass(frozen=True)
class LayerRef:
    """One quantized linear: its module path, block index and projection name."""

    name: str
    block: int
    proj: str

    @property
    def order(self) -> tuple[int, int]:
        return self.block, PROJECTIONS.index(self.proj)


def parse_layer_name(name: str) -> LayerRef | None:
    """The ``LayerRef`` of a module path that names a quantized projection, else None."""
    match = _NAME.match(name)
    if match is None or _PARENT[match.group(3)] != match.group(2):
        return None
    return LayerRef(name, int(match.group(1)), match.group(3))


def sort_layer_names(names: list[str] | tuple[str, ...] | set[str]) -> list[LayerRef]:
    """``LayerRef``s of ``names`` in (block, projection) order; InputError for a name that is not one."""
    refs = []
    for name in names:
        ref = parse_layer_name(name)
        if ref is None:
            raise InputError(f"layer name {name!r} is not a decoder projection (<...>.layers.<i>.<self_attn|mlp>.<proj>)")
        refs.append(ref)
    return sorted(refs, key=lambda r: r.order)


def quantized_linears(model: nn.Module) -> list[LayerRef]:
    """Every q, k, v, o, gate, up, down projection of every block, in (block, projection) order.

    Fails closed when a block lacks one of the seven, so a model that does not have the expected
    architecture cannot silently be quantized in part. Modules already swapped for W8A8 count.
    """
    refs = [ref for name, _ in model.named_modules() if (ref := parse_layer_name(name)) is not None]
    return _complete(refs, type(model).__name__)


def quantized_linears_stored(tensor_names: list[str] | set[str], what: str) -> list[LayerRef]:
    """``quantized_linears`` of the model whose stored tensors are ``tensor_names`` (a projection is
    stored as ``<module path>.weight``), read from the names alone; ``what`` names the files."""
    refs = [ref for name in tensor_names
            if name.endswith(".weight") and (ref := parse_layer_name(name[:-len(".weight")])) is not None]
    return _complete(refs, what)


def _complete(refs: list[LayerRef], what: str) -> list[LayerRef]:
    if not refs:
        raise InputError(f"{what}: no decoder projections (layers.<i>.self_attn.q_proj, ...) found")
    refs.sort(key=lambda r: r.order)
    blocks = sorted({r.block for r in refs})
    if blocks != list(range(len(blocks))):
        raise InputError(f"{what}: decoder blocks are not numbered 0..{len(blocks) - 1}: {blocks[:5]}...")
    for block in blocks:
        have = {r.proj for r in refs if r.block == block}
        if have != set(PROJECTIONS):
            raise InputError(f"{what}: block {block} lacks {sorted(set(PROJECTIONS) - have)}")
    return refs


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule at dotted path ``name``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
