"""How big the parent is, known before it is loaded: shapes, parameter counts, bf16 and W8A8 bytes.

Plan-time code (resources, floors) needs the parent's size without loading weights or importing
transformers: it comes from the synthetic preset, the Hugging Face folder's ``config.json``, the
saved parent of a finished run, or the GGUF file's header. The counts are those of a Llama/Qwen3-style
decoder: seven linears per block,
two RMS norms per block (Qwen3 adds q/k norms of one head's width), embedding, final norm, and a
head that is the embedding when tied.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError

BF16_BYTES = 2
SCALE_BYTES = 4  # one float32 weight scale per output channel of a W8A8 linear
GGUF_KEYS = {  # GGUF metadata (after the architecture prefix) -> config.json field
    "block_count": "num_hidden_layers", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads", "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class ModelSize:
    """A decoder's shape; every byte and parameter count follows from it."""

    blocks: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False

    def projections(self) -> list[tuple[str, int, int]]:
        """(proj, K, N) of one block's seven linears."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [("q_proj", self.hidden, q), ("k_proj", self.hidden, kv), ("v_proj", self.hidden, kv),
                ("o_proj", q, self.hidden), ("gate_proj", self.hidden, self.intermediate),
                ("up_proj", self.hidden, self.intermediate), ("down_proj", self.intermediate, self.hidden)]

    @property
    def linear_params(self) -> int:
        """Weights of the quantized linears (all blocks)."""
        return self.blocks * sum(k * n for _, k, n in self.projections())

    @property
    def linear_rows(self) -> int:
        """Output channels of the quantized linears (one weight scale each)."""
        return self.blocks * sum(n for _, _, n in self.projections())

    @property
    def linear_inputs(self) -> int:
        """Sum of K over the quantized linears: activation elements per token."""
        return self.blocks * sum(k for _, k, _ in self.projections())

    @property
    def max_linear_params(self) -> int:
        return max(k * n for _, k, n in self.projections())

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        norms = self.blocks * (2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)) + self.hidden
        head = 0 if self.tied else self.embedding_params
        return self.linear_params + self.embedding_params + head + norms

    @property
    def parent_bytes(self) -> int:
        """The bf16 parent's tensor bytes."""
        return BF16_BYTES * self.params

    @property
    def checkpoint_bytes(self) -> int:
        """A W8A8 checkpoint's tensor bytes: int8 linears, their float32 scales, everything else bf16."""
        return self.linear_params + SCALE_BYTES * self.linear_rows + BF16_BYTES * (self.params - self.linear_params)

    @property
    def forward_flops_per_token(self) -> int:
        """Multiply-adds x 2 of the linears and the head for one token (attention scores not counted)."""
        return 2 * (self.linear_params + self.embedding_params)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "parent_bytes": self.parent_bytes,
                "checkpoint_bytes": self.checkpoint_bytes}


def _int(fields: Mapping[str, Any], key: str, where: str) -> int:
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def from_hf_config(fields: Mapping[str, Any], where: str = "config.json") -> ModelSize:
    """The size of the decoder a config.json describes (``head_dim`` defaults to hidden / heads)."""
    text = fields.get("text_config")
    if isinstance(text, Mapping):  # multimodal wrappers keep the decoder under text_config
        fields = {**fields, **text}
    hidden, heads = _int(fields, "hidden_size", where), _int(fields, "num_attention_heads", where)
    head_dim = fields.get("head_dim") or hidden // heads
    return ModelSize(blocks=_int(fields, "num_hidden_layers", where), hidden=hidden,
                     intermediate=_int(fields, "intermediate_size", where), heads=heads,
                     kv_heads=int(fields.get("num_key_value_heads") or heads), head_dim=int(head_dim),
                     vocab=_int(fields, "vocab_size", where), tied=bool(fields.get("tie_word_embeddings", False)),
                     qk_norm=fields.get("model_type") == "qwen3")


def read_hf_config(path: Path) -> ModelSize:
    """``from_hf_config`` of a config.json file; unreadable or incomplete is an InputError naming it."""
    try:
        fields = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not readable JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(fields, dict):
        raise InputError(f"{path}: not a JSON object")
    return from_hf_config(fields, str(path))


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_header(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A GGUF file's metadata (scalars and strings as values, arrays as their length) and its tensors'
    shapes, read from the header alone (milliseconds; the gguf package's reader takes seconds)."""
    import mmap
    import struct

    def fail(why: str) -> InputError:
        return InputError(f"{path}: not a readable GGUF file ({why})")

    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            pos = 0

            def take(fmt: str) -> Any:
                nonlocal pos
                value = struct.unpack_from(fmt, data, pos)[0]
                pos += struct.calcsize(fmt)
                return value

            def string() -> str:
                nonlocal pos
                size = take("<Q")
                text = bytes(data[pos:pos + size]).decode("utf-8")
                pos += size
                return text

            def value(kind: int) -> Any:
                nonlocal pos
                if kind in _GGUF_SCALARS:
                    return take(_GGUF_SCALARS[kind])
                if kind == _GGUF_STRING:
                    return string()
                if kind != _GGUF_ARRAY:
                    raise fail(f"unknown value type {kind}")
                item, count = take("<I"), take("<Q")
                if item in _GGUF_SCALARS:
                    pos += count * struct.calcsize(_GGUF_SCALARS[item])
                elif item == _GGUF_STRING:  # skipped by their lengths: the vocabulary is ~10^5 strings
                    length = struct.Struct("<Q").unpack_from
                    for _ in range(count):
                        pos += 8 + length(data, pos)[0]
                    if pos > len(data):
                        raise fail("a string array runs past the end of the file")
                else:
                    for _ in range(count):
                        value(item)
                return count

            if bytes(data[:4]) != b"GGUF":
                raise fail("no GGUF magic")
            pos = 4
            if take("<I") not in (2, 3):
                raise fail("only GGUF versions 2 and 3, little-endian, are read")
            n_tensors, n_fields = take("<Q"), take("<Q")
            fields: dict[str, Any] = {}
            for _ in range(n_fields):
                key = string()
                fields[key] = value(take("<I"))
            tensors: dict[str, tuple[int, ...]] = {}
            for _ in range(n_tensors):
                name = string()
                dims = tuple(take("<Q") for _ in range(take("<I")))
                take("<I"), take("<Q")  # type, offset
                tensors[name] = dims
            return fields, tensors
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise fail(f"{type(exc).__name__}: {exc}") from exc


def from_gguf(path: Path) -> ModelSize:
    """The size from a GGUF file's metadata (architecture-prefixed keys; vocabulary from its tokens)."""
    values, tensors = gguf_header(path)
    arch = values.get("general.architecture")
    fields: dict[str, Any] = {hf: values.get(f"{arch}.{key}") for key, hf in GGUF_KEYS.items()}
    if fields["vocab_size"] is None:
        fields["vocab_size"] = values.get("tokenizer.ggml.tokens")  # the token list's length
    head_dim = values.get(f"{arch}.attention.key_length") or values.get(f"{arch}.rope.dimension_count")
    fields.update(head_dim=head_dim, tie_word_embeddings="output.weight" not in tensors, model_type=arch)
    return from_hf_config(fields, str(path))


def model_size(model_cfg: Mapping[str, Any]) -> ModelSize:
    """The size of the parent ``model_cfg`` (a config's ``model`` block) names, without loading it."""
    source = model_cfg.get("source")
    if source == "synthetic":
        from .synthetic_presets import synthetic_config_fields

        name = (model_cfg.get("synthetic") or {}).get("preset", "tiny")
        return from_hf_config(synthetic_config_fields(name), f"synthetic preset {name}")
    if source == "hf":
        parent = model_cfg.get("parent")
        if not parent or "$" in str(parent):
            raise InputError(f"config model.parent: {parent!r} is not a folder (unset variable?)")
        return read_hf_config(Path(parent) / "config.json")
    if source == "gguf-package":
        from .package import DEFAULT_GGUF_PACKAGE, gguf_package_file

        return from_gguf(gguf_package_file(model_cfg.get("gguf_package") or DEFAULT_GGUF_PACKAGE))
    raise InputError(f"config model.source {source!r}: expected hf, gguf-package or synthetic")
