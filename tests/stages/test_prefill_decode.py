"""prefill_decode stage: the summary from per-sequence rows (cluster interval, no-divergence rows), and
end to end on the tiny synthetic model through the real model and requant stages (schemas, every
checkpoint x arm, attribution consistent with the flip counts, manifest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.config import Config
from int8alibi.protocol import load
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table
from int8alibi.quant.variants import CHECKPOINT_VARIANTS
from int8alibi.engines.prefill_decode import DIVERGENCE_SCHEMA, SUMMARY_SCHEMA, divergence_frame, summary
from int8alibi.stages.prefill_decode import run as prefill_decode
from int8alibi.tokens.margin import cluster_bootstrap_rate

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["exact-cutlass-order", "exact-triton-order"]
BOOT = {"seed": 20250612, "resamples": 2000, "level": 0.9}


def seq(checkpoint: str, s: int, flips: int, differing: int, positions: int = 4, **attributed: object) -> dict:
    row = {"checkpoint": checkpoint, "arm": "a", "sequence": s, "positions": positions,
           "differing_positions": differing, "flips": flips, "diverged": differing > 0, "position": None,
           "flip_at_position": None, "module": None, "module_index": None, "kind": None, "traced": None}
    return {**row, **attributed}


def test_summary_counts_flips_and_takes_the_sequence_cluster_interval() -> None:
    rows = [seq("own", 0, 0, 0), seq("own", 1, 4, 4, position=0, flip_at_position=True, module="lm_head",
                                     module_index=9, kind="head", traced=10),
            seq("probe", 0, 0, 0), seq("probe", 1, 0, 0)]
    frame = divergence_frame(rows)
    table = summary(frame, BOOT).set_index("checkpoint")
    own, probe = table.loc["own"], table.loc["probe"]
    assert (own["flips"], own["positions"], own["flip_rate"], own["sequences_diverging"]) == (4, 8, 0.5, 1)
    # two clusters of 0/4 and 4/4: every resample's rate is 0, 0.5 or 1, so the 90% interval is [0, 1]
    assert (own["flip_rate_low"], own["flip_rate_high"]) == (0.0, 1.0)
    assert (own["flip_rate_low"], own["flip_rate_high"]) == cluster_bootstrap_rate(
        [0, 4], [4, 4], seed=BOOT["seed"], resamples=BOOT["resamples"], level=BOOT["level"])
    # no divergence: "0 of 8 positions flip; no first divergence", a zero-width interval at zero
    assert (probe["flips"], probe["differing_positions"], probe["sequences_diverging"]) == (0, 0, 0)
    assert (probe["flip_rate"], probe["flip_rate_low"], probe["flip_rate_high"]) == (0.0, 0.0, 0.0)
    assert frame["position"].isna().sum() == 3 and frame["module"].isna().sum() == 3


@pytest.fixture(scope="module")
def staged(tiny_pipeline) -> tuple[Config, Path]:
    _, cfg = tiny_pipeline("prefill-decode", ARMS)
    out = cfg.results / "prefill_decode"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        prefill_decode(cfg, out, cfg.results / "requant" / "gate.parquet")
    return cfg, out


@pytest.mark.slow
def test_tiny_model_tables_cover_every_checkpoint_and_arm_and_agree_with_each_other(staged) -> None:
    _, out = staged
    table = read_table(out / "prefill_decode.parquet", SUMMARY_SCHEMA)
    seqs = read_table(out / "first_divergence.parquet", DIVERGENCE_SCHEMA)
    profile = load(ROOT / "preregistration").size_profile("tiny")
    assert sorted(zip(table["checkpoint"], table["arm"])) == sorted((c, a) for c in CHECKPOINT_VARIANTS for a in ARMS)
    assert len(seqs) == len(CHECKPOINT_VARIANTS) * len(ARMS) * int(profile["prompts"])
    assert (seqs["positions"] == int(profile["new_tokens"])).all()
    # a sequence diverges exactly when some position's logits differ, and then it is attributed
    assert (seqs["diverged"] == (seqs["differing_positions"] > 0)).all()
    assert seqs.loc[seqs["diverged"], ["position", "module", "module_index", "kind", "traced"]].notna().all().all()
    assert seqs.loc[~seqs["diverged"], ["position", "module", "module_index", "kind"]].isna().all().all()
    assert (seqs["flips"] <= seqs["differing_positions"]).all()
    merged = seqs.groupby(["checkpoint", "arm"]).agg(flips=("flips", "sum"), positions=("positions", "sum"),
                                                     diverging=("diverged", "sum"))
    for r in table.itertuples():
        assert (r.flips, r.positions, r.sequences_diverging) == tuple(merged.loc[(r.checkpoint, r.arm)])
        assert r.flip_rate_low <= r.flip_rate <= r.flip_rate_high and r.level == 0.9
    attributed = seqs[seqs["diverged"]]
    assert (attributed["module_index"] < attributed["traced"]).all()
    manifest = load_manifest(out / "manifest.json")
    assert {Path(o["path"]).name for o in manifest["outputs"]} >= {"prefill_decode.parquet",
                                                                              "first_divergence.parquet"}
    assert manifest["params"]["checkpoints"] == list(CHECKPOINT_VARIANTS) and manifest["params"]["kernel_arms"] == ARMS
