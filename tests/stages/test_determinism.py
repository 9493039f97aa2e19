"""Determinism stage: agreement tables and the identity join at stage level (hand-made artifacts),
and end to end on the tiny synthetic model with the two exact emulation arms in fresh processes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from int8alibi.config import Config
from int8alibi.inputs.corpus import prompts
from int8alibi.engines.checkpoints import checkpoint_dir
from int8alibi.engines.own import load_w8a8
from int8alibi.engines.identity import Identity, read_identity, write_identity
from int8alibi.errors import InputError
from int8alibi.kernels.registry import get
from int8alibi.protocol import load
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table, write_table
from int8alibi.engines.determinism import agreement, kernel_row, read_artifact
from int8alibi.stages.determinism import run as determinism
from int8alibi.engines.generation import TOKENS_SCHEMA, artifact_dir, artifact_paths, ids_text, parse_ids, sequence_sha256
from int8alibi.quant.variants import CHECKPOINT_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["exact-cutlass-order", "exact-triton-order"]


def config(tmp_path: Path, **extra: object) -> Config:
    data = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}}, "size_profile": "tiny",
            "corpus": {"source": "synthetic"}, "device": "cpu", "arms": ARMS, "exploratory": False,
            "results": str(tmp_path / "results"), **extra}
    return Config(data=data, path=tmp_path / "config.yaml")


def base_identity(arm: str, checkpoint: str, run: int) -> Identity:
    return Identity(
        arm=arm, checkpoint=checkpoint, run=run, prompt_digest="p" * 64, rails_digest="r" * 64,
        checkpoint_digest=f"{checkpoint:c<64}",
        parent_digest="m" * 64, tokenizer_digest="t" * 64, quant_config_digest="q" * 64,
        generation={"prompts": 2, "new_tokens": 4, "decoding": "greedy"},
        engine={"name": "int8alibi-own", "version": "test"}, libraries={"torch": torch.__version__},
        device={"device": "cpu"}, kernel_evidence={"arm": arm, "is_emulation": True},
        cpu={"portable": True, "cpu_capability_effective": "DEFAULT"},
        process={},
    )


def write_artifact(runs: Path, identity: Identity, seqs: list[list[int]]) -> None:
    table, ident = artifact_paths(artifact_dir(runs, identity.arm, identity.checkpoint, identity.run))
    frame = pd.DataFrame({"prompt": range(len(seqs)), "prompt_tokens": [3] * len(seqs),
                          "n_tokens": [len(s) for s in seqs], "sequence_sha256": [sequence_sha256(s) for s in seqs],
                          "token_ids": [ids_text(s) for s in seqs]})
    write_table(frame, table, TOKENS_SCHEMA, sort_by=["prompt"])
    write_identity(ident, identity)


def fill(runs: Path, seqs: dict[tuple[str, str, int], list[list[int]]] | None = None) -> None:
    for arm in ARMS:
        for c in CHECKPOINT_VARIANTS:
            for k in (1, 2):
                default = [[5, 6, 7, 8], [9, 9, 9, 9]]
                write_artifact(runs, base_identity(arm, c, k), (seqs or {}).get((arm, c, k), default))


def test_agreement_reports_the_first_divergence_including_length_boundaries(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_artifact(runs, base_identity(ARMS[0], "own", 1), [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [7, 7, 7, 7]])
    write_artifact(runs, base_identity(ARMS[1], "own", 1), [[1, 2, 3, 4], [1, 2, 0, 4], [0, 2, 3, 4], [7, 7, 7]])
    a, b = (read_artifact(runs, arm, "own", 1) for arm in ARMS)
    identical, first = agreement(a, b)
    assert identical.tolist() == [True, False, False, False]
    assert first.tolist() == [-1, 2, 0, 3]


def test_stage_tables_and_manifest_when_everything_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    runs, out = tmp_path / "runs", tmp_path / "determinism"
    fill(runs, {(ARMS[1], "pow2-ceiling", 1): [[5, 6, 0, 8], [9, 9, 9, 9]],
                (ARMS[1], "pow2-ceiling", 2): [[5, 6, 7, 8], [9, 9, 9, 9]]})
    out.mkdir()
    determinism(config(tmp_path), out, runs)
    summary = read_table(out / "summary.parquet").iloc[0]
    assert (summary["own"], summary["pow2-nearest"], summary["pow2-ceiling"], summary["probe"]) == (
        "2/2", "2/2", "1/2", "2/2")
    assert summary["self_consistent"] == "no" and summary["identity"].startswith("verified")
    assert bool(summary["emulation"]) is True and not bool(summary["allow_unverified"])
    agree = read_table(out / "agreement.parquet")
    row = agree[(agree["checkpoint"] == "pow2-ceiling") & (agree["comparison"] == "arms") & (agree["prompt"] == 0)]
    assert (bool(row["identical"].iloc[0]), int(row["first_divergence"].iloc[0])) == (False, 2)
    runs_row = agree[(agree["checkpoint"] == "pow2-ceiling") & (agree["comparison"] == f"runs-of-{ARMS[1]}")]
    assert runs_row["identical"].tolist() == [False, True]
    assert agree["first_divergence"].isna().sum() == len(agree) - 2
    gens = read_table(out / "generations.parquet")
    assert len(gens) == 2 * 4 * 2 * 2 and gens.iloc[0]["token_ids"] == "5 6 7 8"  # arms x checkpoints x runs x prompts
    kernels = read_table(out / "kernels.parquet")
    assert len(kernels) == 2 * 4 * 2 and set(kernels["engine"]) == {"int8alibi-own test"}
    assert set(zip(kernels["arm"], kernels["kernel"])) == {(a, a) for a in ARMS}  # no implementation named: the arm
    assert kernels["emulation"].all() and set(kernels["selection_environment"]) == {"{}"}
    manifest = load_manifest(out / "manifest.json")
    assert manifest["params"]["allow_unverified"] is False and manifest["extra"]["identity"]["verified"] is True
    assert len(manifest["inputs"]) == 2 * 4 * 2 * 2  # arms x checkpoints x runs x (tokens, identity)


def test_a_tampered_identity_stops_the_stage_unless_explicitly_allowed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    runs, out = tmp_path / "runs", tmp_path / "determinism"
    fill(runs)
    path = artifact_paths(artifact_dir(runs, ARMS[1], "own", 2))[1]
    write_identity(path, dataclasses.replace(read_identity(path), tokenizer_digest="x" * 64))
    out.mkdir()
    with pytest.raises(InputError) as err:
        determinism(config(tmp_path), out, runs)
    assert "tokenizer_digest" in str(err.value) and "x" * 64 in str(err.value) and "t" * 64 in str(err.value)
    assert not (out / "summary.parquet").exists()
    with pytest.raises(InputError, match="expected true or false"):
        determinism(config(tmp_path), out, runs, allow_unverified="yes")

    determinism(config(tmp_path), out, runs, allow_unverified="true")
    for name in ("generations", "agreement", "summary"):
        assert read_table(out / f"{name}.parquet")["allow_unverified"].all()
    assert read_table(out / "summary.parquet").iloc[0]["identity"].startswith("UNVERIFIED")
    manifest = load_manifest(out / "manifest.json")
    assert manifest["params"]["allow_unverified"] is True
    fields = {v["field"] for v in manifest["extra"]["identity"]["violations"]}
    assert fields == {"tokenizer_digest"}


def test_an_artifact_filed_under_the_wrong_arm_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    runs = tmp_path / "runs"
    fill(runs)
    path = artifact_paths(artifact_dir(runs, ARMS[0], "own", 1))[1]
    path.write_text(json.dumps({**json.loads(path.read_text()), "arm": ARMS[1]}))
    with pytest.raises(InputError, match="identity says arm='exact-triton-order'"):
        determinism(config(tmp_path), tmp_path, runs)


def test_token_ids_that_do_not_match_their_digest_or_format_are_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_ids("0 17 3", "x") == [0, 17, 3] and parse_ids("", "x") == []
    for bad in ("1  2", "01 2", "-1", "1 a", " 1"):
        with pytest.raises(InputError, match="not a list of decimal ids"):
            parse_ids(bad, "x")
    monkeypatch.chdir(ROOT)
    runs = tmp_path / "runs"
    fill(runs)
    table = artifact_paths(artifact_dir(runs, ARMS[0], "pow2-nearest", 2))[0]
    frame = read_table(table)
    frame.loc[0, "token_ids"] = "5 6 7 9"
    write_table(frame, table, TOKENS_SCHEMA, sort_by=["prompt"])
    with pytest.raises(InputError, match="prompt 0: token ids do not match their count or sha256"):
        determinism(config(tmp_path), tmp_path, runs)


# End to end on the tiny synthetic model: real model + requant stages, generate in fresh processes.

GENERATE_IN_ONE_PROCESS = """
import sys
from int8alibi.runtime.runner import stage_main
from int8alibi.stages.generate import run
config, results, k = sys.argv[1:4]
for arm in sys.argv[4:]:
    for checkpoint in ("own", "pow2-nearest", "pow2-ceiling", "probe"):
        code = stage_main(run, ["--config", config, "--out", f"{results}/determinism/runs/{arm}/{checkpoint}/run{k}",
                                "--input", f"gate={results}/requant/gate.parquet", "--param", f"arm={arm}",
                                "--param", f"checkpoint={checkpoint}", "--param", f"run={k}"])
        if code:
            sys.exit(code)
"""


@pytest.fixture(scope="module")
def pipe(tiny_pipeline) -> tuple[Path, Config]:
    """(config file, config): the tiny synthetic model through the real model and requant stages."""
    return tiny_pipeline("tiny-pipeline", ARMS)


@pytest.fixture(scope="module")
def generated(pipe: tuple[Path, Config]) -> Path:
    """Run 1 of every artifact in one fresh interpreter, run 2 in another, then the determinism stage.

    (The rule starts one process per artifact; two processes are what the test needs to show that
    each arm reproduces itself across processes, at a third of the start-up cost.)"""
    path, cfg = pipe
    for k in (1, 2):
        done = subprocess.run([sys.executable, "-c", GENERATE_IN_ONE_PROCESS, str(path), str(cfg.results), str(k),
                               *ARMS], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    out = cfg.results / "determinism"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        determinism(cfg, out, out / "runs")
    return out


@pytest.mark.slow
def test_tiny_model_pow2_checkpoints_agree_across_arms_and_each_arm_repeats_itself(generated: Path) -> None:
    out = generated
    summary = read_table(out / "summary.parquet").iloc[0]
    assert summary["pow2-nearest"] == "1/1" and summary["pow2-ceiling"] == "1/1"
    assert summary["self_consistent"] == "yes" and summary["identity"].startswith("verified")
    agree = read_table(out / "agreement.parquet")
    pow2 = agree[agree["checkpoint"].isin(["pow2-nearest", "pow2-ceiling", "probe"])]
    assert pow2["identical"].all() and pow2["first_divergence"].isna().all()
    assert agree[agree["comparison"].str.startswith("runs-of-")]["identical"].all()
    gens = read_table(out / "generations.parquet")
    assert set(gens["n_tokens"]) == {4} and len(gens) == 2 * 4 * 2
    assert summary["probe"] == "1/1"  # the probe's scales are powers of two too
    for arm in ARMS:  # the identity contract was really written by two different runs
        one = read_identity(artifact_paths(artifact_dir(out / "runs", arm, "own", 1))[1])
        two = read_identity(artifact_paths(artifact_dir(out / "runs", arm, "own", 2))[1])
        assert (one.run, two.run) == (1, 2) and one.kernel_evidence == two.kernel_evidence
        assert one.kernel_evidence["is_emulation"] is True


@pytest.mark.slow
def test_tiny_model_pow2_logits_are_bit_identical_across_the_two_epilogue_orders(pipe: tuple[Path, Config]) -> None:
    """Stronger than equal tokens: with power-of-two weight scales the two epilogue orders give the
    same bf16 logits bit for bit, at every position of every protocol prompt."""
    _, cfg = pipe
    cpu = torch.device("cpu")
    analysis = load(ROOT / "preregistration").analysis
    gate = cfg.results / "requant" / "gate.parquet"
    for checkpoint in ("pow2-nearest", "pow2-ceiling"):
        logits: list[list[torch.Tensor]] = []
        for arm in ARMS:
            engine = load_w8a8(cfg, checkpoint_dir(gate, checkpoint), get(arm, cpu), cpu, label=arm)
            with torch.inference_mode():
                logits.append([engine.model(input_ids=torch.tensor([ids])).logits
                               for ids in prompts(engine.tokenizer, analysis, len(analysis["prompts"]))])
        for a, b in zip(*logits):
            assert a.dtype == torch.bfloat16 and a.shape[1] > 1
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_vllm_artifact_names_the_kernel_class_vllm_logged() -> None:
    """The identity of a real vLLM artifact (the H200 study's, committed under docs/measured)."""
    identity = read_identity(ROOT / "docs" / "measured" / "h200-vllm-qwen3-1.7b" / "vllm-triton-own-run1.identity.json")
    row = kernel_row(identity)
    assert row["engine"] == "vllm 0.26.0" and row["emulation"] is False
    assert row["kernel"] == "TritonInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"
    assert json.loads(row["selection_environment"])["VLLM_DISABLED_KERNELS"] == "CutlassInt8ScaledMMLinearKernel"
