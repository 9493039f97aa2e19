"""A throw-away project for provenance tests: protocol files, two stages with manifests, and a
stand-in for int8alibi.protocol (``use_protocol``: where the manifest writer and the audit read it).

The stand-in follows the contract in docs/ARCHITECTURE.md (``current_pins``, ``gate``,
``STAGE_FILES``) by hashing the files on disk, so these tests do not depend on the real protocol
module's state.
"""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from int8alibi.errors import ProtocolError
from int8alibi.provenance import audit, manifest
from int8alibi.provenance.manifest import write_manifest
from int8alibi.files.parquet import write_table

PROTOCOL_FILES = {"thresholds.yaml": "ulp_tolerance: 1\n", "faults.yaml": "faults: [F1, F2]\n"}
TABLE_SCHEMA = pa.schema([("layer", pa.string()), ("k", pa.int32()), ("max_ulp", pa.float32())])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_protocol_stub(amendment: str = "A-0002", stage_files: dict[str, list[str]] | None = None,
                       locked: dict[str, str] | None = None) -> types.ModuleType:
    """Module with the contract's names; ``gate`` fails when a file differs from ``locked``."""
    stub = types.ModuleType("int8alibi.protocol")

    def current_pins(project_root: Path) -> dict:
        root = Path(project_root)
        files = {p.relative_to(root).as_posix(): _sha(p)
                 for p in sorted((root / "preregistration").glob("*.yaml"))}
        return {"amendment": amendment, "files": files, "data": {}}

    def gate(project_root: Path) -> dict:
        for rel, sha in (locked or {}).items():
            if _sha(Path(project_root) / rel) != sha:
                raise ProtocolError(f"{rel}: differs from its pin")
        return {"ok": True}

    stub.current_pins = current_pins
    stub.gate = gate
    stub.STAGE_FILES = stage_files if stage_files is not None else {
        "alpha": ["preregistration/thresholds.yaml"], "beta": ["preregistration/faults.yaml"]}
    return stub


def use_protocol(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> None:
    """Let the manifest writer and the audit read ``module`` as ``int8alibi.protocol``."""
    monkeypatch.setattr(manifest, "protocol", module)
    monkeypatch.setattr(audit, "protocol", module)


def build_run(root: Path, seed: int, results: str = "results", layers: tuple[str, ...] = ("q", "k", "v")) -> Path:
    """Write stages alpha and beta with their manifests under ``root/results``."""
    prot = root / "preregistration"
    alpha = root / results / "alpha"
    alpha.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame({"layer": list(layers), "k": [2048] * len(layers),
                          "max_ulp": [0.0, 1.0, float("inf")][: len(layers)]})
    write_table(frame, alpha / "layers.parquet", TABLE_SCHEMA, ["layer"])
    (alpha / "note.txt").write_text("alpha ran\n")
    external = root.parent / "external-input.bin"
    external.write_bytes(b"\x00\x01\x02")
    write_manifest(alpha, stage="alpha", outputs={"layers": alpha / "layers.parquet", "note": alpha / "note.txt"},
                   inputs=[prot / "thresholds.yaml", external], params={"seed": seed, "m": 4},
                   arms=[{"name": "exact-cutlass-order", "emulation": True}], protocol_root=prot, device="cpu")
    beta = root / results / "beta"
    beta.mkdir(parents=True, exist_ok=True)
    (beta / "summary.txt").write_text(f"rows={len(layers)}\n")
    write_manifest(beta, stage="beta", outputs=[beta / "summary.txt"], inputs=[alpha / "layers.parquet"],
                   params={}, protocol_root=prot, device="cpu")
    return root / results
