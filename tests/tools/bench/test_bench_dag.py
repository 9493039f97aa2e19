"""bench dag on a hand-made results, benchmarks and logs folder, against hand-computed floors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from int8alibi.tools.bench import dag
from int8alibi.runtime.device_memory import PREFIX
from int8alibi.errors import InputError
from int8alibi.planning.floors import Rates, Workload

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
RATES = Rates(device_bw=1e5, device_flops=1e6, host_bw=1e4, host_flops=1e5, link=1e4, disk_read=1e4, disk_write=1e3)
LOAD = Workload(prefill_tokens=4, prompts=2, new_tokens=3, windows=2, window_tokens=8, replay_windows=1,
                replay_window_tokens=8, cells_per_layer=42)
PARENT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 1, "vocab_size": 64, "tie_word_embeddings": True, "model_type": "llama"}


def _tsv(path: Path, *rows: tuple[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(f"{s}\t0:00:00\t{rss}\t1\t1\t1\t0\t0\t0\t0\n" for s, rss in rows))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    results = tmp_path / "results" / "small"
    (results / ".run" / "0123456789abcdef").mkdir(parents=True)
    (results / ".run" / "0123456789abcdef" / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"source": "hf", "parent": "/nowhere"}, "size_profile": "tiny", "resolved": {"device": "cuda"}}))
    (results / ".run" / "current").write_text("0123456789abcdef/config.yaml\n")
    (results / "model" / "parent").mkdir(parents=True)
    (results / "model" / "parent" / "config.json").write_text(json.dumps(PARENT))
    bench = tmp_path / "benchmarks" / "small"
    _tsv(bench / "model.tsv", ("13.504", "120.5"))
    _tsv(bench / "generate" / "arm-a_own_1.tsv", ("10", "500"))
    _tsv(bench / "generate" / "arm-b_own_1.tsv", ("5", "700"), ("6.744", "650"))  # repeated: mean 5.872
    _tsv(bench / "determinism.tsv", ("1.5", "NA"))
    logs = tmp_path / "logs" / "small" / "generate"
    logs.mkdir(parents=True)
    (logs / "arm-a_own_1.log").write_text(f"x INFO {PREFIX} peak_allocated_bytes=1 peak_reserved_bytes={3 << 20} "
                                          "device=H200\n")
    (logs / "arm-b_own_1.log").write_text(f"x INFO {PREFIX} peak_allocated_bytes=1 peak_reserved_bytes={5 << 20} "
                                          "device=H200\nanother line\n")
    return results


def test_rows_sum_seconds_take_peaks_and_divide_by_hand_computed_floors(run: Path):
    root = run.parent.parent
    data, size = dag.run_facts(run)
    assert data["size_profile"] == "tiny" and size.parent_bytes == 6752  # from the saved parent's config.json
    runs = dag.read_benchmarks(root / "benchmarks" / "small")
    peaks = dag.read_device_peaks(root / "logs" / "small")
    assert runs["generate"] == dag.StageRun(jobs=2, seconds=pytest.approx(15.872), max_rss_mib=700.0)
    assert runs["determinism"].max_rss_mib is None
    rows = {r.stage: r for r in dag.dag_rows(runs, peaks, size, LOAD, RATES)}
    # model: 6752 bytes written at 1e3 B/s = 6.752 s (host memory 1.35 s, host compute 4.26 s)
    assert rows["model"].floor == pytest.approx(6.752) and rows["model"].ratio == pytest.approx(2.0)
    # generate: 16 jobs x one 4960-byte checkpoint over the 1e4 B/s link = 7.936 s
    assert rows["generate"].floor == pytest.approx(7.936) and rows["generate"].limit == "transfer"
    assert rows["generate"].ratio == pytest.approx(2.0) and rows["generate"].device_peak_mib == 5.0
    assert rows["determinism"].floor is None and rows["determinism"].ratio is None
    assert rows["capture"].run is None and rows["capture"].ratio is None  # not run: no ratio
    table = dag.format_rows(list(rows.values()), size)
    assert "| generate | 2 | 15.9 | 700 |" in table and "| 5 | 7.94 | transfer | 2.0 |" in table
    assert "Sum of job seconds: 30.9" in table  # 13.504 + 15.872 + 1.5


def test_main_prints_the_table_for_a_run(run: Path, monkeypatch, capsys):
    checkout = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(run.parent.parent)
    assert dag.main([str(Path("results", "small")), "--protocol", str(checkout / "preregistration"),
                     "--link", "1e4"]) == 0
    out = capsys.readouterr().out
    assert "device cuda" in out and "link=1e+04" in out and "device_bw=4.8e+12" in out
    assert "| generate | 2 | 15.9 |" in out


def test_bad_inputs_are_named(tmp_path: Path):
    with pytest.raises(InputError, match="no benchmarks folder"):
        dag.read_benchmarks(tmp_path / "absent")
    _tsv(tmp_path / "b" / "model.tsv", ("fast", "1"))
    with pytest.raises(InputError, match=r"model.tsv: column 's' is 'fast'"):
        dag.read_benchmarks(tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(InputError, match="not a Snakemake benchmark file"):
        dag.read_benchmarks(tmp_path / "c")
    with pytest.raises(InputError, match="no run config"):
        dag.run_facts(tmp_path)


def test_stage_of_a_job_file():
    assert dag.stage_of(Path("model.tsv")) == "model"
    assert dag.stage_of(Path("generate/cublaslt_own_1.tsv")) == "generate"
    assert dag.stage_of(Path("faults/shard_0_8.tsv")) == "faults"
