"""What the Snakefile needs to decide reruns: code, config, source-file and environment digests, GPU use.

Snakemake compares a rule's params with those it recorded for the outputs, so everything that moves
a stage's bytes and that Snakemake cannot see as an input file is a param digest here:

* ``code_digest``: the package code a stage runs (its module's int8alibi imports, transitively),
  so a code change reruns exactly the stages whose code changed;
* ``config_digest``: the config keys a stage reads, expanded (``${VAR}`` replaced) and with
  ``device``/``arms`` as resolved for the run (``int8alibi.resolve``);
* ``source_digests``: the model's source files (the GGUF inside its package, every file of a
  Hugging Face parent directory, a committed checkpoint's files, a WikiText file) by name, size and
  SHA-256. Content, not timestamps: copying or moving a checkout reruns nothing, and editing a file
  does. Hashes are cached by (path, size, mtime, inode) in ``.snakemake/int8alibi/source-digests.json`` so
  a parse hashes a file once per change, not on every invocation;
* ``environment_digest``: the installed versions of the libraries that move bytes and the portable
  CPU settings (``int8alibi.portable``), so changing a pinned library reruns what ran under it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .provenance.environment import library_versions
from .provenance.hashing import sha256_file, stage_code_digest

# Libraries whose version can change a stage's bytes (tables, tensors, tokens). Snakemake itself
# is left out: it schedules, it computes nothing.
BYTE_LIBRARIES = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "transformers", "tokenizers", "gguf",
                  "accelerate", "compressed-tensors", "triton", "vllm")
SOURCE_CACHE = "source-digests.json"
# The reference_checkpoint rule's interpreter outside conda: llm-compressor's own virtualenv
# (./bootstrap builds it from envs/llmcompressor.txt), named relative to the project root.
LLMCOMPRESSOR_VENV = ".venv-llmcompressor"
LLMCOMPRESSOR_LOCK = "envs/llmcompressor.txt"


def _short(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_digest(stage: str) -> str:
    """Digest of the package code that ``int8alibi.stages.<stage>`` can run."""
    return stage_code_digest([f"int8alibi.stages.{stage}"])[:16]


def config_digest(config: Mapping[str, Any], keys: list[str]) -> str:
    """Digest of the config keys a stage reads: changing another key does not rerun it.

    ``config`` is the run config (expanded, with its ``resolved`` block): ``device`` and ``arms``
    enter as resolved, so a run whose ``auto`` now means something else reruns, and one whose
    explicit value equals the earlier resolution does not.
    """
    resolved = config.get("resolved") or {}
    subset = {k: resolved.get(k, config.get(k)) if k in ("device", "arms") else config.get(k) for k in sorted(keys)}
    return _short(subset)


def use_gpu(config: Mapping[str, Any]) -> int:
    """GPUs a GPU-capable rule declares: 1 when the run's resolved device is CUDA, else 0."""
    resolved = config.get("resolved") or {}
    return 1 if resolved.get("device", config.get("device")) == "cuda" else 0


def environment_facts() -> dict[str, Any]:
    """What ``environment_digest`` covers: interpreter, library versions, portable CPU settings."""
    from . import portable

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "libraries": library_versions(BYTE_LIBRARIES),
        "portable": portable.enabled(),
        "pinned_env": {name: os.environ.get(name, "unset") for name in (*portable.PINNED_ENV, "ONEDNN_MAX_CPU_ISA")},
        "forward_threads": portable.FORWARD_THREADS,
    }


def environment_digest() -> str:
    """Digest of ``environment_facts()``: a changed library version reruns every stage that ran under it."""
    return _short(environment_facts())


def llmcompressor_python(conda: bool) -> str:
    """The reference_checkpoint rule's interpreter: the job's conda environment's ``python`` under
    ``--sdm conda`` (envs/llmcompressor.yaml), else llm-compressor's virtualenv, by a relative path."""
    return "python" if conda else f"{LLMCOMPRESSOR_VENV}/bin/python"


def lock_digest(lock: str | os.PathLike[str] = LLMCOMPRESSOR_LOCK) -> str:
    """Digest of a lock file: the reference rule's stand-in for ``environment_digest``, which
    describes Snakemake's own environment, not the one that rule runs in."""
    return sha256_file(lock)[:16]


def put_interpreter_on_path(environ: dict[str, str] | None = None) -> None:
    """Put the directory of this interpreter first on ``PATH``, so a job's plain ``python`` is the one
    Snakemake runs in (rules name no absolute interpreter: their command text must not depend on
    where the checkout or its environment lives)."""
    env = os.environ if environ is None else environ
    here = os.path.dirname(sys.executable)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[0] != here:
        env["PATH"] = here + os.pathsep + path if path else here


def _unset(value: Any) -> bool:
    return isinstance(value, str) and "$" in value


def _tree(label: str, root: Path) -> list[tuple[str, Path]]:
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            files.append((f"{label}/{path.relative_to(root).as_posix()}", path))
    return sorted(files)


def _synthetic_needs_no_file(model: Mapping[str, Any]) -> bool:
    from .model.synthetic import PRESETS

    name = (model.get("synthetic") or {}).get("preset", "tiny")
    return name in PRESETS and PRESETS[name].tokenizer == "bytes"


def source_files(config: Mapping[str, Any]) -> dict[str, list[tuple[str, Path]] | str]:
    """The files outside the project that stages read, by role: ``parent`` (the model stage),
    ``checkpoint`` (requant's committed checkpoint), ``corpus`` (capture, perplexity, tokens).

    Each is a list of ``(label, path)``, or a string saying why there is nothing to list (an unset
    variable, a missing path): the string enters the digest, so fixing it reruns the stage, which is
    where a missing file stops the run with its own error.
    """
    from .model.sources import DEFAULT_GGUF_PACKAGE, gguf_package_file

    model = config["model"]
    out: dict[str, list[tuple[str, Path]] | str] = {}

    def directory(label: str, value: Any) -> list[tuple[str, Path]] | str:
        if _unset(value):
            return f"unset: {value}"
        path = Path(value)
        return _tree(label, path) if path.is_dir() else f"missing directory: {path.resolve().as_posix()}"

    if model["source"] == "hf":
        out["parent"] = directory("parent", model.get("parent"))
    elif model["source"] == "synthetic" and _synthetic_needs_no_file(model):
        out["parent"] = "synthetic: no file (seeded weights, byte tokenizer)"
    else:  # the GGUF package: the parent itself, or (synthetic tiny) the tokenizer the seeded model uses
        package = model.get("gguf_package") or DEFAULT_GGUF_PACKAGE
        try:
            gguf = gguf_package_file(package)
            out["parent"] = [(f"{package}/{gguf.name}", gguf)]
        except Exception as exc:  # the stage reports it; here it only enters the digest
            out["parent"] = f"not found: {exc}"
    checkpoint = model.get("checkpoint")
    out["checkpoint"] = directory("checkpoint", checkpoint) if checkpoint else "none"
    corpus = config.get("corpus") or {}
    path = corpus.get("path") if corpus.get("source") == "wikitext" else None
    if path is None:
        out["corpus"] = f"{corpus.get('source')}: no file"
    elif _unset(path):
        out["corpus"] = f"unset: {path}"
    else:
        out["corpus"] = [("corpus", Path(path))] if Path(path).is_file() else f"missing file: {Path(path).resolve()}"
    return out


class DigestCache:
    """SHA-256 of files, remembered by (absolute path, size, mtime_ns, inode) in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.known: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.used: dict[str, str] = {}

    def sha256(self, file: Path) -> tuple[int, str]:
        st = file.stat()
        key = f"{file.resolve().as_posix()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        if key not in self.known:
            if st.st_size > 1 << 30:
                sys.stderr.write(f"int8alibi: hashing {file} ({st.st_size / 2**30:.1f} GiB) once; cached in "
                                 f"{self.path}\n")
            self.known[key] = sha256_file(file)
        self.used[key] = self.known[key]
        return st.st_size, self.known[key]

    def save(self) -> None:
        """Keep what this parse used; written only when that changed (atomically: jobs may parse at once)."""
        try:
            if json.loads(self.path.read_text()) == self.used:
                return
        except (OSError, ValueError):
            pass
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.used, sort_keys=True, indent=0))
        os.replace(tmp, self.path)


def source_digests(config: Mapping[str, Any], cache_dir: Path) -> dict[str, str]:
    """``{role: digest}`` of ``source_files(config)``: names, sizes and SHA-256 of the files' bytes."""
    cache = DigestCache(Path(cache_dir) / SOURCE_CACHE)
    out = {}
    for role, files in source_files(config).items():
        if isinstance(files, str):
            out[role] = _short(files)
        else:
            out[role] = _short([(label, *cache.sha256(path)) for label, path in files])
    cache.save()
    return out


def shard_ranges(index_path: str, shards: int) -> list[tuple[int, int]]:
    """Split the captured layers of the faults campaign into ``shards`` contiguous [start, stop) ranges."""
    from .faults.sources import OperandSource

    total = OperandSource.resolve(index_path).layer_count() or 0
    bounds = [round(i * total / shards) for i in range(shards + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
