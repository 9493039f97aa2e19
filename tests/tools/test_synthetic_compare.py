"""synthetic_compare: the compare stage's comparison on seeded synthetic operands of a model's shapes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from int8alibi.analysis import layer_comparison
from int8alibi.tools import synthetic_compare
from int8alibi.kernels.layer_operands import ModelShapes
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table

PROJECT = Path(__file__).resolve().parents[2]
SHAPES = ModelShapes(2, (("self_attn", "q_proj", 64, 48), ("mlp", "down_proj", 96, 64)))
EXACT_PAIR = ["exact-cutlass-order", "exact-triton-order"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the protocol outside any git repository (history check: not possible)."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "project"
    for rel in ("preregistration", "amendments"):
        shutil.copytree(PROJECT / rel, root / rel)
    return root


def test_synthetic_shapes_entry_point_on_cpu(project: Path) -> None:
    out = project / "results" / "compare-synthetic"
    summary = synthetic_compare.compare_synthetic(SHAPES, 8, EXACT_PAIR, out, device="cpu", project_root=project)
    layers = read_table(out / "layers.parquet", layer_comparison.LAYERS_SCHEMA)
    assert set(zip(summary.setting, summary.phase)) == {
        (s, p) for s in ("real", "pow2-snapped") for p in ("prefill", "decode")}
    assert (summary["layers"] == len(SHAPES.layers())).all()
    assert layers["exploratory"].all() and load_manifest(out / "manifest.json")["exploratory"] is True
    pow2 = layers[layers.setting == "pow2-snapped"]
    assert pow2["predicted_bitwise"].all() and (pow2["differing"] == 0).all()
    assert pd.Series(layers["m"]).isin([8, 1]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (cublaslt and triton arms)")
def test_synthetic_qwen3_shapes_on_gpu_with_cublaslt_and_triton(project: Path) -> None:
    out = project / "results" / "compare-gpu"
    summary = synthetic_compare.compare_synthetic("qwen3-1.7b", 512, ["cublaslt", "triton"], out, device="cuda",
                                                  blocks=2, project_root=project)
    assert (summary["layers"] == 14).all()
    assert (summary["prediction_failed"] == 0).all()
    assert (summary.loc[summary.setting == "pow2-snapped", "layers_differing"] == 0).all()
    real = summary[summary.setting == "real"]
    assert (real["max_ulp"].fillna(0) <= 1).all()
