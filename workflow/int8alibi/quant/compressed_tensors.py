"""W8A8 checkpoints in the compressed-tensors layout (what llm-compressor writes and vLLM reads).

Layout: ``<layer>.weight`` int8 [N,K] and ``<layer>.weight_scale`` bf16 [N,1] for every quantized
linear, every other tensor (embeddings, norms, lm_head) in bf16, and ``config.json`` carrying the
model config plus a ``quantization_config`` (format ``int-quantized``, quant_method
``compressed-tensors``, channel-wise symmetric int8 weights, dynamic per-token int8 activations).

Loading is fail-closed: anything that is not exactly that scheme (other bit widths, groups,
asymmetric weights, static activation scales, transforms, a quantized KV cache), a missing or
mis-shaped scale, a non-finite or non-positive scale, or layer names that differ from the
parent's raises InputError naming the file and the reason. Tensors are read lazily (safetensors
memory maps), so a large checkpoint is validated without holding its weights in memory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import InputError
from ..files.atomic import temp_dir
from .weight import QuantizedWeight

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 4 << 30

# The scheme under study, as compressed-tensors spells it.
WEIGHT_ARGS: dict[str, Any] = {
    "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False,
    "group_size": None, "block_structure": None, "actorder": None, "observer": "memoryless_minmax",
    "observer_kwargs": {}, "scale_dtype": None, "zp_dtype": None,
}
INPUT_ARGS: dict[str, Any] = {
    "num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True,
    "group_size": None, "block_structure": None, "actorder": None, "observer": None,
    "observer_kwargs": {}, "scale_dtype": None, "zp_dtype": None,
}
# Which fields decide the arithmetic; a loaded checkpoint must match these exactly.
_REQUIRED_WEIGHT = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
_REQUIRED_INPUT = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
_MUST_BE_EMPTY_WEIGHT = ("group_size", "block_structure", "actorder", "scale_dtype", "zp_dtype")
FORMAT = "int-quantized"
QUANT_METHOD = "compressed-tensors"

_DTYPES = {"I8": torch.int8, "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
           "F64": torch.float64, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
           "U8": torch.uint8, "BOOL": torch.bool}


def quantization_config(ignore: Iterable[str] = ("lm_head",)) -> dict[str, Any]:
    """The ``quantization_config`` block this project writes (llm-compressor's W8A8 scheme)."""
    return {
        "config_groups": {"group_0": {
            "format": FORMAT, "targets": ["Linear"], "weights": dict(WEIGHT_ARGS),
            "input_activations": dict(INPUT_ARGS), "output_activations": None,
        }},
        "format": FORMAT,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
    }


class Checkpoint(Mapping[str, QuantizedWeight]):
    """A validated checkpoint: layer name -> ``QuantizedWeight`` (read on access), plus the rest.

    Layer names are module paths (``model.layers.0.self_attn.q_proj``), in sorted order.
    """

    def __init__(self, path: Path, config: dict[str, Any], files: dict[str, Path],
                 shapes: dict[str, tuple[int, ...]], layers: tuple[str, ...]) -> None:
        self.path = path
        self.config = config
        self._files = files
        self.shapes = shapes
        self.layers = layers
        quantized = {f"{layer}.{suffix}" for layer in layers for suffix in ("weight", "weight_scale")}
        self.other_names: tuple[str, ...] = tuple(sorted(set(files) - quantized))
        self._handles: dict[Path, Any] = {}  # one open file per shard: its header is parsed once, not per tensor

    def _read(self, name: str) -> torch.Tensor:
        path = self._files[name]
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt", device="cpu")
        return self._handles[path].get_tensor(name)

    def __getitem__(self, layer: str) -> QuantizedWeight:
        if layer not in self.layers:
            raise KeyError(layer)
        return QuantizedWeight(self._read(f"{layer}.weight"), self._read(f"{layer}.weight_scale"))

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def tensor(self, name: str) -> torch.Tensor:
        """A non-quantized tensor (embedding, norm, lm_head) by its state-dict name."""
        if name not in self.other_names:
            raise KeyError(name)
        return self._read(name)


def _fail(path: Path, reason: str) -> InputError:
    return InputError(f"{path}: {reason}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(path, "not found; a compressed-tensors checkpoint needs it") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _fail(path, f"not readable JSON ({type(exc).__name__}: {exc})") from exc


def _check_args(path: Path, group: str, kind: str, args: Any, required: Mapping[str, Any]) -> None:
    if not isinstance(args, Mapping):
        raise _fail(path, f"quantization_config group {group!r} has no {kind} arguments; "
                          "not channel-wise symmetric int8 W8A8")
    wrong = {k: args.get(k) for k, v in required.items() if args.get(k) != v}
    if wrong:
        raise _fail(path, f"quantization_config group {group!r} {kind} {wrong} differ from {dict(required)}: "
                          "not channel-wise symmetric int8 weights with dynamic per-token int8 activations")


def check_quantization_config(path: Path, config: Any) -> dict[str, Any]:
    """The validated ``quantization_config`` of ``config`` (read from ``path``), or InputError."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(qc, Mapping):
        raise _fail(path, "no quantization_config block; not a compressed-tensors checkpoint")
    if qc.get("quant_method") != QUANT_METHOD:
        raise _fail(path, f"quant_method {qc.get('quant_method')!r}, expected {QUANT_METHOD!r}")
    if qc.get("format") != FORMAT:
        raise _fail(path, f"format {qc.get('format')!r}, expected {FORMAT!r} (int8 weights stored unpacked)")
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key):
            raise _fail(path, f"{key} is set; only plain W8A8 (no sparsity, no transforms) is supported")
    if qc.get("kv_cache_scheme") is not None:
        raise _fail(path, "kv_cache_scheme is set; the W8A8 path under study quantizes linear layers only")
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise _fail(path, "quantization_config has no config_groups")
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            raise _fail(path, f"quantization_config group {name!r} is not a mapping")
        if group.get("format", FORMAT) != FORMAT:
            raise _fail(path, f"group {name!r} format {group.get('format')!r}, expected {FORMAT!r}")
        _check_args(path, name, "weights", group.get("weights"), _REQUIRED_WEIGHT)
        filled = {k: group["weights"].get(k) for k in _MUST_BE_EMPTY_WEIGHT if group["weights"].get(k) is not None}
        if filled:
            raise _fail(path, f"group {name!r} weights set {filled}; channel-wise int8 needs them unset")
        _check_args(path, name, "input_activations", group.get("input_activations"), _REQUIRED_INPUT)
        if group.get("output_activations") is not None:
            raise _fail(path, f"group {name!r} quantizes output activations; not part of W8A8")
    return dict(qc)


def _tensor_files(root: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or an index of shards)."""
    single, index = root / SINGLE_FILE, root / INDEX_FILE
    if index.is_file():
        data = _read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, Mapping) else None
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise _fail(index, "no weight_map")
        files = {str(name): root / str(shard) for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise _fail(index, f"names shard {shard.name}, which does not exist")
        return files
    if single.is_file():
        return {name: single for name in _keys(single)}
    raise _fail(root, f"no {SINGLE_FILE} or {INDEX_FILE}; not a safetensors checkpoint")


def _keys(file: Path) -> list[str]:
    try:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return list(handle.keys())
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise _fail(file, f"not a readable safetensors file ({type(exc).__name__}: {exc})") from exc


def _metadata(files: dict[str, Path]) -> dict[str, tuple[torch.dtype | str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape), from the headers only; every indexed name must exist in its shard."""
    out: dict[str, tuple[torch.dtype | str, tuple[int, ...]]] = {}
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    for file, names in sorted(by_file.items()):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                present = set(handle.keys())
                for name in names:
                    if name not in present:
                        raise _fail(file, f"tensor {name!r} is indexed here but absent")
                    view = handle.get_slice(name)
                    out[name] = (_DTYPES.get(view.get_dtype(), view.get_dtype()), tuple(view.get_shape()))
        except InputError:
            raise
        except Exception as exc:
            raise _fail(file, f"not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    return out


def _check_tensors(root: Path, files: dict[str, Path],
                   meta: dict[str, tuple[torch.dtype | str, tuple[int, ...]]]) -> tuple[str, ...]:
    """Validate names, dtypes and shapes; return the quantized layer names."""
    for name, (dtype, _) in meta.items():
        for suffix, why in ((".weight_zero_point", "asymmetric weights (weight_zero_point present)"),
                            (".input_scale", "static activation scales (input_scale present)"),
                            (".input_zero_point", "asymmetric activations (input_zero_point present)")):
            if name.endswith(suffix):
                raise _fail(files[name], f"tensor {name!r}: {why}; not symmetric int8 W8A8 with dynamic activations")
        if dtype == torch.int8 and not name.endswith(".weight"):
            raise _fail(files[name], f"int8 tensor {name!r} is not a layer weight")
        if dtype not in (torch.int8, torch.bfloat16):
            raise _fail(files[name], f"tensor {name!r} is {dtype}; expected int8 weights and bfloat16 otherwise")
    layers = sorted(name[: -len(".weight_scale")] for name in meta if name.endswith(".weight_scale"))
    for layer in layers:
        weight, scale = f"{layer}.weight", f"{layer}.weight_scale"
        if weight not in meta:
            raise _fail(files[scale], f"{scale!r} has no {weight!r}")
        w_dtype, w_shape = meta[weight]
        s_dtype, s_shape = meta[scale]
        if w_dtype != torch.int8 or len(w_shape) != 2:
            raise _fail(files[weight], f"{weight!r} is {w_dtype} {list(w_shape)}; expected int8 [N,K] beside its scale")
        if s_dtype != torch.bfloat16 or s_shape != (w_shape[0], 1):
            raise _fail(files[scale], f"{scale!r} is {s_dtype} {list(s_shape)}; expected bfloat16 [{w_shape[0]}, 1] "
                                      "(one scale per output channel)")
    quantized = set(layers)
    orphans = sorted(n for n, (d, _) in meta.items() if d == torch.int8 and n[: -len(".weight")] not in quantized)
    if orphans:
        raise _fail(files[orphans[0]], f"int8 weight {orphans[0]!r} has no weight_scale "
                                       f"({len(orphans)} such weight(s))")
    if not layers:
        raise _fail(root, "no quantized layers (no <layer>.weight_scale tensors)")
    return tuple(layers)


def _check_scales(checkpoint: Checkpoint) -> None:
    for layer in checkpoint.layers:
        scale = checkpoint._read(f"{layer}.weight_scale")
        bad = ~torch.isfinite(scale) | (scale <= 0)
        if bool(bad.any()):
            first = int(bad.flatten().nonzero()[0])
            raise _fail(checkpoint._files[f"{layer}.weight_scale"],
                        f"{layer}.weight_scale has {int(bad.sum())} zero, negative or non-finite scale(s) "
                        f"(first at channel {first}: {scale.flatten()[first].item()!r})")


def check_layer_names(checkpoint: Checkpoint, expected: Iterable[str], against: str) -> None:
    """InputError unless the checkpoint quantizes exactly the layers ``expected`` (named by ``against``)."""
    want, have = set(expected), set(checkpoint.layers)
    if want != have:
        missing, extra = sorted(want - have), sorted(have - want)
        raise _fail(checkpoint.path, f"quantized layers differ from {against}: {len(missing)} missing "
                                     f"(first: {missing[:3]}), {len(extra)} extra (first: {extra[:3]})")


def load_checkpoint(path: str | os.PathLike[str], expected_layers: Iterable[str] | None = None,
                    against: str = "the parent") -> Checkpoint:
    """Open and validate a compressed-tensors W8A8 directory (lazy tensors, eager checks)."""
    root = Path(path)
    if not root.is_dir():
        raise _fail(root, "checkpoint directory not found")
    config = _read_json(root / CONFIG)
    check_quantization_config(root / CONFIG, config)
    files = _tensor_files(root)
    meta = _metadata(files)
    layers = _check_tensors(root, files, meta)
    checkpoint = Checkpoint(root, config, files, {n: s for n, (_, s) in meta.items()}, layers)
    _check_scales(checkpoint)
    if expected_layers is not None:
        check_layer_names(checkpoint, expected_layers, against)
    return checkpoint


class CheckpointWriter:
    """Write a checkpoint layer by layer, in shards of bounded size, appearing only when complete.

    Everything goes to a temporary directory beside ``path``; ``close`` writes config.json (the
    model config with this project's ``quantization_config`` and an ``int8alibi`` provenance block)
    and renames the directory onto ``path``. An exception inside ``with`` leaves nothing behind.
    """

    def __init__(self, path: str | os.PathLike[str], model_config: Mapping[str, Any], *,
                 provenance: Mapping[str, Any] | None = None, copy_files: Iterable[Path] = (),
                 shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = temp_dir(self.path.parent, self.path.name)
        config = {k: v for k, v in model_config.items() if k != "quantization_config"}
        config["quantization_config"] = quantization_config()
        if provenance is not None:
            config["int8alibi"] = dict(provenance)
        self._config = config
        self._copy = [Path(p) for p in copy_files]
        self._limit = shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []
        self._names: set[str] = set()

    def add_layer(self, layer: str, weight: QuantizedWeight) -> None:
        w_q, s_w = weight
        if w_q.dtype != torch.int8 or w_q.dim() != 2 or s_w.dtype != torch.bfloat16 or tuple(s_w.shape) != (w_q.shape[0], 1):
            raise InputError(f"{self.path}: layer {layer!r}: expected int8 [N,K] and bf16 [N,1], got "
                             f"{w_q.dtype} {tuple(w_q.shape)} and {s_w.dtype} {tuple(s_w.shape)}")
        self._add(f"{layer}.weight", w_q)
        self._add(f"{layer}.weight_scale", s_w)

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dtype != torch.bfloat16:
            raise InputError(f"{self.path}: non-quantized tensor {name!r} is {tensor.dtype}; expected bfloat16")
        self._add(name, tensor)

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._names:
            raise InputError(f"{self.path}: tensor {name!r} written twice")
        self._names.add(name)
        t = tensor.detach().to("cpu").contiguous()
        self._pending[name] = t
        self._pending_bytes += t.numel() * t.element_size()
        if self._pending_bytes >= self._limit:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        shard = self._tmp / f".shard-{len(self._shards):05d}.safetensors"
        save_file(self._pending, str(shard), metadata={"format": "pt"})
        self._shards.append((shard, sorted(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> Path:
        self._flush()
        if not self._shards:
            raise InputError(f"{self.path}: no tensors written")
        if len(self._shards) == 1:
            self._shards[0][0].rename(self._tmp / SINGLE_FILE)
        else:
            total, weight_map = len(self._shards), {}
            for i, (shard, names) in enumerate(self._shards, start=1):
                final = f"model-{i:05d}-of-{total:05d}.safetensors"
                shard.rename(self._tmp / final)
                weight_map.update({n: final for n in names})
            index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
            (self._tmp / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        for src in self._copy:
            shutil.copy2(src, self._tmp / src.name)
        (self._tmp / CONFIG).write_text(json.dumps(self._config, indent=2, sort_keys=True) + "\n")
        for f in self._tmp.iterdir():
            f.chmod(0o644)
        self._tmp.chmod(0o755)
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def save_checkpoint(path: str | os.PathLike[str], layers: Mapping[str, QuantizedWeight],
                    other: Mapping[str, torch.Tensor], model_config: Mapping[str, Any], *,
                    provenance: Mapping[str, Any] | None = None, copy_files: Iterable[Path] = (),
                    shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Write a whole checkpoint at once (see ``CheckpointWriter``) and return its directory."""
    with CheckpointWriter(path, model_config, provenance=provenance, copy_files=copy_files,
                          shard_bytes=shard_bytes) as writer:
        for layer in sorted(layers):
            writer.add_layer(layer, layers[layer])
        for name in sorted(other):
            writer.add_tensor(name, other[name])
    return Path(path)
