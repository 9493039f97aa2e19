"""capture: the tiny synthetic Qwen3 run as W8A8 on the pinned tokens; deterministic, complete, checked.

The own and pow2-nearest checkpoints are built here with the project's quantizer (what the
requant stage writes); the capture stage is then run twice into separate folders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from int8alibi.config import Config, load_config
from int8alibi.inputs.corpus import encode, load_corpus
from int8alibi.engines.checkpoints import checkpoint_dir
from int8alibi.errors import GateError, InputError, ProtocolError
from int8alibi.model.layers import quantized_linears
from int8alibi.model.sources import load_source
from int8alibi.model.w8a8 import quantize_linears
from int8alibi.kernels.layer_operands import load_operands, operand_digest
from int8alibi.inputs.prompts import capture_sizes, decode_prompt, prefill_tile, token_digest
from int8alibi.protocol import load
from int8alibi.files.hashing import sha256_file
from int8alibi.provenance.manifest_format import load_manifest
from int8alibi.files.parquet import read_table, write_table
from int8alibi.stages import capture
from int8alibi.stages import model as model_stage
from int8alibi.stages import requant as requant_stage
from int8alibi.kernels import capture_index
from int8alibi.quant import gate as requant_gate

PROJECT = Path(__file__).resolve().parents[2]
ANALYSIS = load(PROJECT / "preregistration").analysis


def make_config(tmp: Path) -> Config:
    path = tmp / "config.yaml"
    path.write_text((PROJECT / "config" / "config.yaml").read_text())
    return load_config(path, {
        "model.source": "synthetic", "model.synthetic": {"preset": "tiny", "seed": 0},
        "corpus.source": "synthetic", "size_profile": "tiny", "device": "cpu",
        "arms": ["exact-cutlass-order", "exact-triton-order"], "results": str(tmp / "results"),
    })


@pytest.fixture(scope="module")
def requant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    """(config, gate path): the model and requant stages run on the tiny synthetic Qwen3."""
    tmp = tmp_path_factory.mktemp("capture")
    cfg = make_config(tmp)
    model_stage.run(cfg, Path(cfg.results) / "model")
    requant_stage.run(cfg, Path(cfg.results) / "requant", protocol=PROJECT / "preregistration")
    return cfg, Path(cfg.results) / "requant" / "gate.parquet"


@pytest.fixture(scope="module")
def two_runs(requant: tuple[Config, Path]) -> tuple[Path, Path]:
    cfg, gate = requant
    outs = []
    for run_id in ("a", "b"):
        out = Path(cfg.results) / f"capture-{run_id}"
        capture.run(cfg, out, gate=gate, project_root=PROJECT)
        outs.append(out)
    return outs[0], outs[1]


def test_two_runs_give_identical_operands(two_runs: tuple[Path, Path]) -> None:
    first, second = two_runs
    index_a = read_table(first / "index.parquet", capture_index.INDEX_SCHEMA)
    index_b = read_table(second / "index.parquet", capture_index.INDEX_SCHEMA)
    assert index_a.equals(index_b)  # every layer's operand digest, shapes and token digest
    assert sha256_file(first / "index.parquet") == sha256_file(second / "index.parquet")
    for rel, rows in index_a.groupby("file"):  # and the files hold exactly those operands
        recorded = dict(zip(rows["layer"], rows["operand_digest"]))
        for out in (first, second):
            assert {op.layer: operand_digest(op) for op in load_operands(out / rel)} == recorded


def test_index_lists_every_layer_of_both_checkpoints_and_phases(requant: tuple[Config, Path],
                                                                two_runs: tuple[Path, Path]) -> None:
    cfg, _ = requant
    out = two_runs[0]
    index = read_table(out / "index.parquet", capture_index.INDEX_SCHEMA)
    model, tokenizer, _ = load_source(cfg)
    refs = quantized_linears(model)
    sizes = capture_sizes(ANALYSIS, "tiny")
    assert len(index) == len(refs) * 2 * 2
    for (checkpoint, phase), group in index.groupby(["checkpoint", "phase"]):
        assert sorted(group["layer"]) == sorted(r.name for r in refs)
        assert set(group["m"]) == {sizes.prefill_tokens if phase == "prefill" else 1}
        assert set(group["file"]) == {capture_index.operand_file(checkpoint, phase)}
        for entry, op in capture_index.iter_index_operands(out / "index.parquet", checkpoint, phase):
            module = model.get_submodule(entry.layer)
            assert (op.k, op.n) == (module.in_features, module.out_features)
            assert operand_digest(op) == entry.operand_digest
    prefill = prefill_tile(tokenizer, load_corpus(cfg, ANALYSIS), sizes.prefill_tokens, ANALYSIS)
    assert set(index.loc[index.phase == "prefill", "tokens_sha256"]) == {prefill.sha256}


def test_captured_operands_are_what_the_kernel_sees(requant: tuple[Config, Path], two_runs: tuple[Path, Path]) -> None:
    cfg, _ = requant
    out = two_runs[0]
    model, _, _ = load_source(cfg)
    own = quantize_linears(model, "none")
    pow2 = quantize_linears(model, "nearest")
    for checkpoint, weights in (("own", own), ("pow2-nearest", pow2)):
        for op in load_operands(out / capture_index.operand_file(checkpoint, "prefill")):
            w_q, s_w = weights[op.layer]
            assert torch.equal(op.w_q, w_q) and torch.equal(op.s_w, s_w.float().flatten())
            assert op.s_a.dtype == torch.float32 and bool((op.a_q.abs() <= 127).all())
    # the first layer's input is the embedding of the prefill tokens, normalised: its operands do
    # not depend on the checkpoint, deeper layers' do
    first = "model.layers.0.self_attn.q_proj"
    a = {op.layer: op for op in load_operands(out / capture_index.operand_file("own", "prefill"))}
    b = {op.layer: op for op in load_operands(out / capture_index.operand_file("pow2-nearest", "prefill"))}
    assert torch.equal(a[first].a_q, b[first].a_q) and torch.equal(a[first].s_a, b[first].s_a)
    assert not all(torch.equal(a[n].a_q, b[n].a_q) for n in a)


def test_manifest_records_tokens_arm_and_generated_step(requant: tuple[Config, Path],
                                                        two_runs: tuple[Path, Path]) -> None:
    cfg, _ = requant
    manifest = load_manifest(two_runs[0] / "manifest.json")
    _, tokenizer, _ = load_source(cfg)
    prompt = decode_prompt(tokenizer, ANALYSIS)
    assert manifest["params"]["capture_arm"] == "exact-cutlass-order"
    assert manifest["extra"]["gate"] == {name: [requant_gate.GATE_SELF_BUILT] for name in capture.CHECKPOINTS}
    assert manifest["arms"][0]["arm"] == "exact-cutlass-order" and manifest["arms"][0]["is_emulation"] is True
    assert manifest["extra"]["decode_prompt"]["sha256"] == prompt.sha256
    assert prompt.token_ids.tolist() == encode(tokenizer, ANALYSIS["prompts"][0])
    for checkpoint in capture.CHECKPOINTS:
        generated = manifest["extra"]["generated"][checkpoint]
        sequence = torch.cat([prompt.token_ids, torch.tensor([generated["token_id"]])])
        assert generated["sequence_sha256"] == token_digest(sequence)
    index = read_table(two_runs[0] / "index.parquet", capture_index.INDEX_SCHEMA)
    decode = index[(index.phase == "decode") & (index.checkpoint == "own")]
    assert set(decode["tokens_sha256"]) == {manifest["extra"]["generated"]["own"]["sequence_sha256"]}


def test_prefill_tile_is_the_first_corpus_tokens(requant: tuple[Config, Path]) -> None:
    cfg, _ = requant
    _, tokenizer, _ = load_source(cfg)
    corpus = load_corpus(cfg, ANALYSIS)
    tile = prefill_tile(tokenizer, corpus, 8, ANALYSIS)
    assert tile.token_ids.tolist() == encode(tokenizer, corpus.text)[:8]
    assert tile.sha256 == token_digest(torch.tensor(encode(tokenizer, corpus.text)[:8]))
    too_long = len(encode(tokenizer, corpus.text)) + 1
    with pytest.raises(InputError, match="prefill tile needs"):
        prefill_tile(tokenizer, corpus, too_long, ANALYSIS)


def test_size_profile_rules() -> None:
    assert capture_sizes(ANALYSIS, "study").prefill_tokens == 512
    with pytest.raises(ProtocolError, match="no size profile"):
        capture_sizes(ANALYSIS, "huge")
    odd = {"size_profiles": {"x": {"prefill_tokens": 4, "decode_tokens": 2}}}
    with pytest.raises(ProtocolError, match="decode_tokens=2"):
        capture_sizes(odd, "x")


def test_tampered_operand_file_is_refused(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = two_runs[1]
    index = read_table(out / "index.parquet", capture_index.INDEX_SCHEMA)
    index.loc[0, "operand_digest"] = "0" * 64
    tampered = tmp_path / "index.parquet"
    write_table(index, tampered, capture_index.INDEX_SCHEMA, capture_index.INDEX_KEY)
    (tmp_path / "operands").symlink_to(out / "operands")
    row = index.loc[0]
    with pytest.raises(InputError, match="operand digest"):
        list(capture_index.iter_index_operands(tampered, row.checkpoint, row.phase))


def test_capture_reads_checkpoints_only_behind_a_passing_gate_that_covers_them(requant: tuple[Config, Path],
                                                                             tmp_path: Path) -> None:
    _, gate = requant
    table = read_table(gate, requant_gate.GATE_SCHEMA)
    partial = table[table.arm != "pow2-nearest"].reset_index(drop=True)
    for column in ("bytes_equal", "differing_int8", "differing_scales", "clipped", "f32_division_differing"):
        partial[column] = partial[column].astype({"bytes_equal": "boolean"}.get(column, "Int64"))
    write_table(partial, tmp_path / "gate.parquet", requant_gate.GATE_SCHEMA, requant_gate.GATE_KEY)
    (tmp_path / "checkpoints").symlink_to(gate.parent / "checkpoints")  # every checkpoint is there
    with pytest.raises(InputError, match="no gate rows for checkpoint 'pow2-nearest'"):
        checkpoint_dir(tmp_path / "gate.parquet", "pow2-nearest")
    assert checkpoint_dir(tmp_path / "gate.parquet", "own") == tmp_path / "checkpoints" / "own"
    # a table that covers every checkpoint but whose own arm is not byte-identical is no pass either
    failed = table.copy()
    for column in ("bytes_equal", "differing_int8", "differing_scales", "clipped", "f32_division_differing"):
        failed[column] = failed[column].astype({"bytes_equal": "boolean"}.get(column, "Int64"))
    failed.loc[failed.arm == "own", "bytes_equal"] = False
    write_table(failed, tmp_path / "gate.parquet", requant_gate.GATE_SCHEMA, requant_gate.GATE_KEY)
    stage = tmp_path / "capture"
    with pytest.raises(GateError, match="not byte-identical"):
        capture.run(requant[0], stage, gate=tmp_path / "gate.parquet", project_root=PROJECT)


def test_failed_capture_leaves_nothing_that_looks_complete(requant: tuple[Config, Path], tmp_path: Path) -> None:
    cfg, gate = requant
    stage = tmp_path / "requant"
    (stage / "checkpoints").mkdir(parents=True)
    (stage / "gate.parquet").write_bytes(gate.read_bytes())
    (stage / "checkpoints" / "own").symlink_to(gate.parent / "checkpoints" / "own")  # pow2-nearest is missing
    out = tmp_path / "capture"
    out.mkdir()
    (out / "index.parquet").write_bytes(b"an earlier run's index")
    with pytest.raises(InputError, match="pow2-nearest"):
        capture.run(cfg, out, gate=stage / "gate.parquet", project_root=PROJECT)
    assert sorted(p.name for p in out.iterdir()) == []
