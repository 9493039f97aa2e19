"""The identity contract of a generation artifact: everything its tokens may depend on.

Two artifacts are compared (same sequences or not) only if they differ in exactly the declared
treatment: the kernel arm, or the run (a fresh process). Any other difference (prompts,
checkpoint bytes, tokenizer, quantization config, engine or library versions, device) would make
a disagreement uninterpretable, so ``join`` fails closed naming the field and both values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError
from ..files.atomic import write_bytes
from ..files.hashing import canonical_json, sha256_bytes, sha256_tree

Treatment = Literal["arm", "run"]
FORMAT = "int8alibi-identity/2"

# Fields allowed to differ under each treatment. The kernel evidence names the kernel that ran,
# so it is part of the arm by construction; across runs of one arm it must be identical.
TREATMENT_FIELDS: dict[str, tuple[str, ...]] = {
    "arm": ("arm", "kernel_evidence"),
    "run": ("run",),
}
# Facts of the one process that made an artifact (the digest of its engine log, which holds
# timestamps and process ids): different between any two artifacts by construction, so recorded
# for the reader and never compared. The kernel the log names is compared, as kernel_evidence.
PER_PROCESS_FIELDS = ("process",)
# CPU facts recorded for the reader but allowed to differ when both artifacts were computed under
# the portable CPU settings, which make bytes independent of them (int8alibi.portable): jobs of
# one run may land on different cluster hosts.
HOST_FIELDS = ("cpu.cpu_model", "cpu.cpu_flags_sha256", "cpu.cpu_features", "cpu.cpu_capability_detected",
               "cpu.mkl.auto_branch", "cpu.steering.")


@dataclass(frozen=True)
class Identity:
    """What one artifact (arm x checkpoint x run) was computed from and with."""

    arm: str
    checkpoint: str
    run: int
    prompt_digest: str
    rails_digest: str
    checkpoint_digest: str
    parent_digest: str
    tokenizer_digest: str
    quant_config_digest: str
    generation: Mapping[str, Any]
    engine: Mapping[str, Any]
    libraries: Mapping[str, Any]
    device: Mapping[str, Any]
    kernel_evidence: Mapping[str, Any]
    cpu: Mapping[str, Any]
    process: Mapping[str, Any]
    source: str = field(default="<memory>", compare=False)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) with the format tag; ``source`` is where it was read from, not content."""
        body = {k: v for k, v in asdict(self).items() if k != "source"}
        return canonical_json({"format": FORMAT, **body})


@dataclass(frozen=True)
class Mismatch:
    """One field (dotted path into nested records) where two identities disagree."""

    field: str
    a: Any
    b: Any

    def describe(self) -> str:
        return f"{self.field}: {self.a!r} vs {self.b!r}"


ABSENT = "<absent>"
_CONTENT_FIELDS = tuple(f.name for f in fields(Identity) if f.name != "source")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "arm": str, "checkpoint": str, "run": int, "prompt_digest": str, "rails_digest": str, "checkpoint_digest": str,
    "parent_digest": str, "tokenizer_digest": str, "quant_config_digest": str,
    "generation": dict, "engine": dict, "libraries": dict, "device": dict, "kernel_evidence": dict,
    "cpu": dict, "process": dict,
}


def checkpoint_digest(checkpoint_dir: Path) -> str:
    """Digest of a checkpoint directory: every file's name and bytes."""
    return sha256_tree(checkpoint_dir)


def quant_config_digest(checkpoint_dir: Path) -> str:
    """Digest of the ``quantization_config`` block of the checkpoint's config.json (canonical JSON)."""
    path = Path(checkpoint_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: checkpoint has no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(config, dict) or not isinstance(config.get("quantization_config"), dict):
        raise InputError(f"{path}: no quantization_config block; not a compressed-tensors checkpoint")
    return sha256_bytes(canonical_json(config["quantization_config"]).encode())


def engine_log(identity: Identity, folder: Path) -> Path | None:
    """The engine log an artifact's ``process`` names (relative to its folder), re-hashed against the
    recorded digest; None for an engine that keeps no log. A missing or changed log is InputError:
    it is the only evidence of the kernel that ran."""
    name = identity.process.get("log")
    if name is None:
        return None
    path = Path(folder) / str(name)
    if not path.is_file():
        raise InputError(f"{identity.source}: engine log {path} is missing; the kernel evidence cannot be checked")
    if sha256_bytes(path.read_bytes()) != identity.process.get("log_sha256"):
        raise InputError(f"{path}: SHA-256 differs from the one recorded in {identity.source}")
    return path


def rails_digest(generation: Mapping[str, Any], engine: Mapping[str, Any]) -> str:
    """Digest of the rails every sequence is decoded on: the generation settings (prompt count, new
    tokens, greedy, size profile) and the engine's decoding and build settings."""
    rails = {"generation": dict(generation), "decoding": engine.get("decoding"), "settings": engine.get("settings")}
    return sha256_bytes(canonical_json(rails).encode())


def write_identity(path: str | Path, identity: Identity) -> Path:
    """Write the identity JSON atomically."""
    return write_bytes(path, (identity.to_json() + "\n").encode("utf-8"))


def read_identity(path: str | Path) -> Identity:
    """Parse and validate an identity file; a missing or mistyped field names the file and field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{p}: identity file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{p}: not a readable identity JSON file ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{p}: not an {FORMAT} file")
    unknown = sorted(set(data) - set(_CONTENT_FIELDS) - {"format"})
    if unknown:
        raise InputError(f"{p}: unknown identity field {unknown[0]!r}")
    for name in _CONTENT_FIELDS:
        if name not in data:
            raise InputError(f"{p}: identity field {name!r} is missing")
        kind = _TYPES[name]
        if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
            raise InputError(f"{p}: identity field {name!r} must be {getattr(kind, '__name__', kind)}, "
                             f"got {type(data[name]).__name__}")
    return Identity(**{name: data[name] for name in _CONTENT_FIELDS}, source=str(p))


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key in value:
            _flatten(value[key], f"{prefix}.{key}", out)
    else:
        out[prefix] = value


def flat(identity: Identity) -> dict[str, Any]:
    """``{dotted field: leaf value}`` so a mismatch names the innermost field (``libraries.torch``)."""
    out: dict[str, Any] = {}
    for name in _CONTENT_FIELDS:
        _flatten(getattr(identity, name), name, out)
    return out


def mismatches(a: Identity, b: Identity, treatment: Treatment) -> list[Mismatch]:
    """Every field where ``a`` and ``b`` differ outside ``treatment``, plus the treatment field
    itself when it does not differ (an artifact joined with itself proves nothing)."""
    if treatment not in TREATMENT_FIELDS:
        raise InputError(f"identity join: unknown treatment {treatment!r} (expected arm or run)")
    allowed = TREATMENT_FIELDS[treatment]
    fa, fb = flat(a), flat(b)
    portable = fa.get("cpu.portable") is True and fb.get("cpu.portable") is True
    found = [
        Mismatch(key, fa.get(key, ABSENT), fb.get(key, ABSENT))
        for key in sorted(set(fa) | set(fb))
        if key.split(".", 1)[0] not in allowed + PER_PROCESS_FIELDS and fa.get(key, ABSENT) != fb.get(key, ABSENT)
        and not (portable and key.startswith(HOST_FIELDS))
    ]
    primary = allowed[0]
    if getattr(a, primary) == getattr(b, primary):
        found.insert(0, Mismatch(primary, getattr(a, primary), getattr(b, primary)))
    return found


def evidence_problem(identity: Identity) -> str | None:
    """Why an artifact's kernel evidence proves nothing (empty, another arm's, or for vLLM not the
    verified selection record of its log), or None when it is well formed."""
    evidence = identity.kernel_evidence
    if not evidence:
        return "empty kernel evidence"
    if evidence.get("arm") != identity.arm:
        return f"kernel evidence names arm {evidence.get('arm')!r}, the artifact is arm {identity.arm!r}"
    if identity.engine.get("name") == "vllm":
        from .vllm_engine import evidence_problem as vllm_problem

        return vllm_problem(identity.arm, evidence, identity.process)
    return None


def join(a: Identity, b: Identity, treatment: Treatment, *, allow_unverified: bool = False) -> list[Mismatch]:
    """Verify that ``a`` and ``b`` carry well-formed kernel evidence and differ only in ``treatment``;
    return the violations.

    Without ``allow_unverified`` the first violation raises InputError naming both files, the
    field and both values; with it the violations are returned for the caller to record.
    """
    found = [Mismatch(f"kernel_evidence of {side}", ident.source, problem)
             for side, ident in (("a", a), ("b", b)) if (problem := evidence_problem(ident)) is not None]
    found += mismatches(a, b, treatment)
    if found and not allow_unverified:
        first = found[0]
        reason = ("the kernel evidence does not verify" if first.field.startswith("kernel_evidence of ")
                  else f"the declared treatment {treatment!r} does not differ"
                  if first.field == TREATMENT_FIELDS[treatment][0] else f"only {treatment!r} may differ")
        more = f" (and {len(found) - 1} more field(s))" if len(found) > 1 else ""
        raise InputError(f"identity join {a.source} vs {b.source}: {first.describe()}; {reason}{more}")
    return found
