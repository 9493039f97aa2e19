"""What the Snakefile needs to decide reruns: one readable param per thing that moves bytes, GPU use.

Snakemake compares a rule's params with those it recorded for the outputs, and its reason names the
params that differ, so everything that moves a stage's bytes and that Snakemake cannot see as an
input file is a param here, each a line a person can read ("code int8alibi/stages/report.py 2460d1703b",
"config corpus: {...}", "library torch 2.13.0"); protocol files are inputs, named by Snakemake:

* ``code_params``: one per package module a stage can run (its module's int8alibi imports,
  transitively), by the module's syntax tree (``files.code``): a comment or docstring edit
  reruns nothing, any other edit reruns exactly the stages that can run that module;
* ``config_params``: one per config key a stage reads, expanded (``${VAR}`` replaced) and with
  ``device``/``arms`` as resolved for the run (``int8alibi.planning.resolve``);
* ``source_digests``: the model's source files (the GGUF inside its package, every file of a
  Hugging Face parent directory, a committed checkpoint's files, a WikiText file) by name, size and
  SHA-256. Content, not timestamps: copying or moving a checkout reruns nothing, and editing a file
  does. Hashes are cached by (path, size, mtime, inode) in ``.snakemake/int8alibi/source-digests.json`` so
  a parse hashes a file once per change, not on every invocation;
* ``environment_params``: the interpreter, the installed versions of the libraries that move bytes
  and the portable CPU settings (``int8alibi.portable``), so changing a pinned library reruns what
  ran under it; ``lock_param`` stands in for them where a rule runs in an environment of its own.

Those params describe the interpreter Snakemake runs in, which is the one its jobs run in (outside
``--sdm conda``). One that lacks a library no stage runs without (``missing_libraries``: the planning
environment of ``workflow/envs/plan.txt``) can neither run the stages nor tell whether a finished run is
current: ``unjudged`` says so in one line instead of a plan that reruns everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..files.code import CodeDigests
from ..provenance.environment import library_versions
from ..files.hashing import sha256_file
from ..tools.venv_stamp import lock_file
from ..planning.stage_needs import STAGES

# Libraries whose version can change a stage's bytes (tables, tensors, tokens). Snakemake itself
# is left out: it schedules, it computes nothing. scipy fits the K sweep; jinja2 renders the report.
BYTE_LIBRARIES = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "transformers", "tokenizers", "gguf",
                  "accelerate", "compressed-tensors", "triton", "vllm", "scipy", "jinja2")
# The libraries no stage runs without: an interpreter lacking one cannot run a stage, and its library
# params describe no environment a stage ran in.
STAGE_LIBRARIES = ("torch", "numpy", "pandas", "pyarrow")
# The project's environment (./bootstrap), relative to the project root: where commands find their
# interpreter when the one planning cannot run them.
PROJECT_BIN = ".venv/bin"
PROJECT_PYTHON = f"{PROJECT_BIN}/python"
SOURCE_CACHE = "source-digests.json"
CODE_CACHE = "code-digests.json"
# The reference_checkpoint rule's interpreter outside conda: llm-compressor's own virtualenv
# (./bootstrap builds it from its lock), named relative to the project root.
LLMCOMPRESSOR_VENV = ".venv-llmcompressor"
LLMCOMPRESSOR_LOCK = lock_file("llmcompressor")


# What Snakemake expands in a string param as a wildcard: "{name}" or "{name,constraint}" (its own
# pattern has no escape). A config value can hold one: a "${VAR}" left as written while VAR is unset.
_WILDCARD_LIKE = re.compile(r"\{(\s*[.\w]+\s*(?:,[^{}]*)?)\}")


def inert(text: str) -> str:
    """``text`` as a param Snakemake leaves as it is: each "{name}" written "<name>" (planning a run
    whose config still names an unset variable would otherwise stop at a WildcardError, where it should
    plan and warn). Inner ones first, as often as needed ("{w,a{3,5}}" is "<w,a<3,5>>"). Texts without
    one, every param of a run that can execute, are returned unchanged."""
    while (done := _WILDCARD_LIKE.sub(r"<\1>", text)) != text:
        text = done
    return text


def _short(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _name(kind: str, what: str) -> str:
    """A param name (an identifier): ``code_int8alibi_stages_report_py``."""
    return f"{kind}_{re.sub(r'[^0-9A-Za-z]+', '_', what).strip('_')}"


def code_params(stage: str, digests: CodeDigests) -> dict[str, str]:
    """One param per module ``int8alibi.stages.<stage>`` can run: ``code <path> <syntax digest>``."""
    return {_name("code", rel): f"code {rel} {digest[:16]}"
            for rel, digest in digests.closure(f"int8alibi.stages.{stage}").items()}


def config_params(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, str]:
    """One param per config key a stage reads: changing another key does not rerun it.

    ``config`` is the run config (expanded, with its ``resolved`` block): ``device`` and ``arms``
    enter as resolved, so a run whose ``auto`` now means something else reruns, and one whose
    explicit value equals the earlier resolution does not.
    """
    resolved = config.get("resolved") or {}
    out = {}
    for key in sorted(keys):
        value = resolved.get(key, config.get(key)) if key in ("device", "arms") else config.get(key)
        out[_name("config", key)] = f"config {key}: {json.dumps(value, sort_keys=True, default=str)}"
    return out


def use_gpu(config: Mapping[str, Any]) -> int:
    """GPUs a GPU-capable rule declares: 1 when the run's resolved device is CUDA, else 0."""
    resolved = config.get("resolved") or {}
    return 1 if resolved.get("device", config.get("device")) == "cuda" else 0


def environment_facts() -> dict[str, Any]:
    """What ``environment_params`` covers: interpreter, library versions, portable CPU settings."""
    from .. import portable

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "libraries": library_versions(BYTE_LIBRARIES),
        "portable": portable.enabled(),
        "pinned_env": {name: os.environ.get(name, "unset") for name in (*portable.PINNED_ENV, "ONEDNN_MAX_CPU_ISA")},
        "forward_threads": portable.FORWARD_THREADS,
    }


def environment_params() -> dict[str, str]:
    """``environment_facts()`` as params: a changed library version reruns every stage that ran under it."""
    facts = environment_facts()
    out = {"env_python": f"python {facts['python']}"}
    out.update({_name("library", name): f"library {name} {version}" for name, version in facts["libraries"].items()})
    pinned = json.dumps(facts["pinned_env"], sort_keys=True)
    out["env_portable"] = (f"portable CPU settings {'on' if facts['portable'] else 'off'}, "
                           f"forward threads {facts['forward_threads']}: {pinned}")
    return out


def missing_libraries() -> list[str]:
    """The ``STAGE_LIBRARIES`` this interpreter lacks (looked up, not imported)."""
    return [name for name, version in library_versions(STAGE_LIBRARIES).items() if version == "absent"]


def job_python(conda: bool, root: Path, missing: Iterable[str] = ()) -> str:
    """The interpreter a job's command names: ``python`` of the job's environment under ``--sdm conda``;
    the project's environment (``PROJECT_PYTHON``) when the one Snakemake runs in lacks ``missing``
    libraries (it plans, it cannot run a stage); else the one Snakemake runs in, relative to the project
    root when inside it (the command then runs as printed, pasted in that folder). Rules write it as a
    placeholder, so the rule's text (Snakemake's ``code`` trigger) is the same wherever the checkout or
    its environment lives."""
    if conda:
        return "python"
    if list(missing):
        return PROJECT_PYTHON
    here = Path(sys.executable)
    try:
        return here.absolute().relative_to(Path(root).absolute()).as_posix()
    except ValueError:
        return here.as_posix()


def _lacking(missing: list[str]) -> str:
    return f"{', '.join(missing)}, which every stage computes with, {'is' if len(missing) == 1 else 'are'} not installed"


def unjudged(results: str, missing: list[str], sources: Mapping[str, str]) -> str | None:
    """Why this interpreter cannot say which jobs of the run in ``results`` rerun, as one line; None when
    it lacks none of ``STAGE_LIBRARIES`` or ``results`` holds no stage folder (then every job runs anyway).

    Without them every recorded library version reads as changed, and a model source found through an
    installed package (``sources``: ``source_digests``) reads as missing: a plan would rerun everything.
    """
    if not missing or not any(Path(results, stage).is_dir() for stage in STAGES):
        return None
    unseen = "".join(f"; {text}" for text in sources.values() if ": not found: " in text)
    return (f"this environment cannot judge the finished run in {results}: {_lacking(missing)} for "
            f"{sys.executable}, so every library version the run recorded would read as changed{unseen}; "
            f"nothing is claimed to rerun: plan it with the project's environment ({PROJECT_BIN}/snakemake)")


def cannot_run(missing: list[str]) -> str:
    """Why a run does not start from an interpreter that lacks ``missing`` ``STAGE_LIBRARIES``: its jobs
    would record params of an environment no stage ran in (or fail to import them)."""
    return (f"{_lacking(missing)} for {sys.executable}: this environment plans runs, it does not run stages; "
            f"run snakemake from the project's environment ({PROJECT_BIN}/snakemake)")


def llmcompressor_python(conda: bool) -> str:
    """The reference_checkpoint rule's interpreter: the job's conda environment's ``python`` under
    ``--sdm conda`` (workflow/envs/llmcompressor.yaml), else llm-compressor's virtualenv, by a relative path."""
    return "python" if conda else f"{LLMCOMPRESSOR_VENV}/bin/python"


def lock_param(lock: str | os.PathLike[str] = LLMCOMPRESSOR_LOCK) -> dict[str, str]:
    """A lock file's digest: the reference rule's stand-in for ``environment_params``, which describe
    Snakemake's own environment, not the one that rule runs in."""
    return {"env_lock": f"lock {Path(lock).as_posix()} sha256 {sha256_file(lock)[:16]}"}


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
    from ..model.synthetic_presets import PRESETS

    name = (model.get("synthetic") or {}).get("preset", "tiny")
    return name in PRESETS and PRESETS[name].tokenizer == "bytes"


def source_files(config: Mapping[str, Any]) -> dict[str, list[tuple[str, Path]] | str]:
    """The files outside the project that stages read, by role: ``parent`` (the model stage),
    ``checkpoint`` (requant's committed checkpoint), ``corpus`` (capture, perplexity, tokens).

    Each is a list of ``(label, path)``, or a string saying why there is nothing to list (an unset
    variable, a missing path): the string enters the digest, so fixing it reruns the stage, which is
    where a missing file stops the run with its own error.
    """
    from ..model.package import DEFAULT_GGUF_PACKAGE, gguf_package_file

    model = config["model"]
    out: dict[str, list[tuple[str, Path]] | str] = {}

    def directory(label: str, value: Any) -> list[tuple[str, Path]] | str:
        if _unset(value):
            return f"unset: {value}"
        path = Path(value)
        if not path.is_dir():
            return f"missing directory: {path.resolve().as_posix()}"
        files = _tree(label, path)
        broken = next((p for _, p in files if not p.exists()), None)  # a link to nothing: the stage refuses it
        return f"broken link: {broken.as_posix()}" if broken is not None else files

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
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.used, sort_keys=True, indent=0))
            os.replace(tmp, self.path)
        except OSError as exc:  # a cache that cannot be kept only costs the next plan its speed
            sys.stderr.write(f"int8alibi: plan caches not saved: {self.path}: {exc.strerror or exc}\n")


def source_digests(config: Mapping[str, Any], cache_dir: Path) -> dict[str, str]:
    """``{role: text}`` for ``source_files(config)``: how many files and the digest of their names,
    sizes and SHA-256, or why there is nothing to list."""
    cache = DigestCache(Path(cache_dir) / SOURCE_CACHE)
    out = {}
    for role, files in source_files(config).items():
        if isinstance(files, str):
            out[role] = f"{role} files: {files}"
        else:
            digest = _short([(label, *cache.sha256(path)) for label, path in files])
            out[role] = f"{role} files: {len(files)} file{'s' if len(files) != 1 else ''}, digest {digest}"
    cache.save()
    return out


def rerun_params(stage: str, config: Mapping[str, Any], digests: CodeDigests, keys: Iterable[str],
                 sources: Mapping[str, str], environment: Mapping[str, str]) -> dict[str, str]:
    """Every param that reruns ``stage``: its code, the config keys it reads, the source files it reads
    (``{role: source_digests text}``) and the environment it runs in (``environment_params()`` or
    ``lock_param()``)."""
    params = {**code_params(stage, digests), **config_params(config, keys),
              **{_name("source", role): text for role, text in sources.items()}, **environment}
    return {name: inert(text) for name, text in params.items()}


def shard_ranges(index_path: str, shards: int) -> list[tuple[int, int]]:
    """Split the captured layers of the faults campaign into ``shards`` contiguous [start, stop) ranges."""
    from ..faults.sources import OperandSource

    total = OperandSource.resolve(index_path).layer_count() or 0
    bounds = [round(i * total / shards) for i in range(shards + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
