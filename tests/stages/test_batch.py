"""batch stage end to end on the tiny synthetic model through the real model, requant and capture
stages: every captured prefill layer through both exact arms and the bf16 contrast at every
registered M, every prompt alone and in batches, the prediction for the emulated INT8 arms, the
manifest; and the fail-closed refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from int8alibi.batch.layer import LAYER_SCHEMA
from int8alibi.batch.sequence import SEQUENCE_SCHEMA
from int8alibi.batch.summary import BY_M_SCHEMA, SUMMARY_SCHEMA
from int8alibi.config import Config
from int8alibi.errors import InputError
from int8alibi.protocol import load
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.stages import batch, capture

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["exact-cutlass-order", "exact-triton-order"]


@pytest.fixture(scope="module")
def staged(tiny_pipeline) -> tuple[Config, Path]:
    _, cfg = tiny_pipeline("batch", ARMS)
    gate = cfg.results / "requant" / "gate.parquet"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        capture.run(cfg, cfg.results / "capture", gate=gate, project_root=ROOT)
        batch.run(cfg, cfg.results / "batch", index=cfg.results / "capture" / "index.parquet", gate=gate)
    return cfg, cfg.results / "batch"


@pytest.mark.slow
def test_every_layer_arm_and_m_is_measured_and_the_emulated_int8_arms_hold(staged) -> None:
    _, out = staged
    spec = load(ROOT / "preregistration").batch
    layers = read_table(out / "layers.parquet", LAYER_SCHEMA)
    ms = spec["layer"]["ms"]["tiny"]
    assert set(layers["gemm"]) == {*ARMS, "bf16"} and set(layers["checkpoint"]) == set(spec["layer"]["checkpoints"])
    per = layers.groupby(["checkpoint", "layer", "gemm"])["m"].apply(list)
    assert all(v == ms for v in per)
    assert (layers["rows"] == layers["m"] * spec["layer"]["draws"]).all()
    int8 = layers[layers["kind"] == "int8"]
    assert (int8["rows_differing"] == 0).all() and (int8["max_ulp"] == 0).all()
    table = read_table(out / "summary.parquet", SUMMARY_SCHEMA)
    rows = table[(table["level"] == "layer") & (table["kind"] == "int8")]
    assert set(rows["outcome"]) == {"holds"} and rows["predicted_identical"].all()
    assert set(table.loc[table["kind"] != "int8", "outcome"]) == {"no prediction"}
    by_m = read_table(out / "by_m.parquet", BY_M_SCHEMA)
    assert int(by_m["rows"].sum()) == int(layers["rows"].sum())
    seqs = read_table(out / "sequences.parquet", SEQUENCE_SCHEMA)
    sizes = spec["sequence"]["size_profiles"]["tiny"]
    assert len(seqs) == len(spec["sequence"]["checkpoints"]) * len(ARMS) * sum(
        -(-sizes["prompts"] // n) * n for n in sizes["batch_sizes"])
    assert (seqs["identical"] == seqs["first_step"].isna()).all()
    assert seqs.loc[~seqs["identical"], "module"].notna().all()
    manifest = load_manifest(out / "manifest.json")
    assert manifest["params"]["kernel_arms"] == ARMS and manifest["extra"]["extension"] is True
    assert manifest["params"]["contrasts"]["fp8"] == "not run: no GPU"


@pytest.mark.slow
def test_ms_larger_than_the_captured_rows_are_refused_naming_the_protocol_file(staged, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _ = staged
    protocol = load(ROOT / "preregistration")
    bad = {**protocol.batch, "layer": {**protocol.batch["layer"], "ms": {**protocol.batch["layer"]["ms"],
                                                                          "tiny": [1, 9]}}}
    monkeypatch.setattr(batch, "load", lambda: type(protocol)(**{**protocol.__dict__, "batch": bad}))
    monkeypatch.chdir(ROOT)
    out = tmp_path / "batch"
    with pytest.raises(InputError, match=r"^preregistration/batch.yaml: layer.ms.tiny for own/model.layers.0.*"
                                         r"batch sizes \[9\] .* 8 captured rows"):
        batch.run(cfg, out, index=cfg.results / "capture" / "index.parquet",
                  gate=cfg.results / "requant" / "gate.parquet")
    assert not (out / "manifest.json").exists()


class _MDependent:
    """A planted INT8 arm that is not batch invariant: below M = 8 its epilogue adds one ulp."""

    name, is_emulation = "planted-m-dependent", True

    def __init__(self, inner) -> None:
        self.inner, self.device = inner, inner.device

    def scaled_mm(self, a_q, w_q, s_a, s_w):
        out = self.inner.scaled_mm(a_q, w_q, s_a, s_w)
        return (out.view(torch.int16) + 1).view(torch.bfloat16) if a_q.shape[0] < 8 else out

    def evidence(self) -> dict:
        return {**self.inner.evidence(), "arm": self.name}


@pytest.mark.slow
def test_a_planted_batch_dependent_arm_fails_the_prediction_at_the_ms_where_it_changes(
        staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _ = staged
    device, arm_a, arm_b, selection = batch.stage_arms(cfg)
    monkeypatch.setattr(batch, "stage_arms", lambda _cfg: (device, arm_a, _MDependent(arm_b), selection))
    monkeypatch.chdir(ROOT)
    out = tmp_path / "batch"
    batch.run(cfg, out, index=cfg.results / "capture" / "index.parquet", gate=cfg.results / "requant" / "gate.parquet")
    table = read_table(out / "summary.parquet", SUMMARY_SCHEMA).set_index(["level", "checkpoint", "gemm"])
    for checkpoint in load(ROOT / "preregistration").batch["layer"]["checkpoints"]:
        planted = table.loc[("layer", checkpoint, "planted-m-dependent")]
        assert planted["outcome"] == "fails" and planted["worst_m"] == 1 and planted["max_ulp"] == 1
        assert table.loc[("layer", checkpoint, ARMS[0]), "outcome"] == "holds"
    layers = read_table(out / "layers.parquet", LAYER_SCHEMA)
    mine = layers[layers["gemm"] == "planted-m-dependent"]
    assert (mine.loc[mine["m"] < 8, "rows_differing"] == mine.loc[mine["m"] < 8, "rows"]).all()
    assert (mine.loc[mine["m"] >= 8, "rows_differing"] == 0).all()
