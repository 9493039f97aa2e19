"""The disk a run needs, known when it is planned: per stage from the parent's size, less what is finished,
against the free space; a run that won't fit is refused in one line naming the figures and the folder."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

from int8alibi import stage_spec
from int8alibi.errors import InputError
from int8alibi.model.size import model_size
from int8alibi.planning import disk
from int8alibi.planning.floors import Workload, stage_work
from int8alibi.protocol import load

PROTOCOL = load()


def _size(preset: str):
    return model_size({"source": "synthetic", "synthetic": {"preset": preset}})


def _study() -> Workload:
    return Workload.from_protocol(PROTOCOL.analysis, PROTOCOL.tokens, PROTOCOL.faults, "study")


def _run(preset: str, device: str = "cuda") -> dict:
    return {"model": {"source": "synthetic", "synthetic": {"preset": preset, "seed": 0}}, "size_profile": "study",
            "device": "auto", "resolved": {"device": device}}


def _manifest(results: Path, stage: str) -> None:
    path = results / stage_spec.table(stage, stage_spec.MANIFEST)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")


def test_a_stage_is_floors_disk_write_plus_its_files_and_tables():
    size, load = _size("qwen3-1.7b"), _study()
    need = disk.stage_bytes(size, load, disk.run_stages("cuda"))
    for name, b in need.items():
        written = stage_work(size, load)[name].disk_write if name in stage_work(size, load) else 0
        assert b == math.ceil(written * (1 + disk.FILES_MARGIN)) + disk.TABLES_BYTES, name
    # the saved parent and the four checkpoints, at 1.7B's 3.44 GB parent and 2.03 GB checkpoint
    assert need["model"] - disk.TABLES_BYTES == pytest.approx(3.44e9 * 1.02, rel=5e-3)
    assert need["requant"] - disk.TABLES_BYTES == pytest.approx(4 * 2.03e9 * 1.02, rel=5e-3)


def test_estimates_grow_with_the_model():
    load, stages = _study(), disk.run_stages("cuda")
    by_size = [disk.stage_bytes(_size(p), load, stages) for p in ("qwen3-1.7b", "qwen3-8b", "qwen3-14b")]
    for small, large in zip(by_size, by_size[1:]):
        assert sum(small.values()) < sum(large.values())
        for name in ("model", "reference", "requant", "capture"):
            assert small[name] < large[name], name
    # the 8B parent, its reference and four checkpoints: ~60 GB (issue), ~64 GB with their files
    eight = by_size[1]
    assert 60e9 < eight["model"] + eight["reference"] + eight["requant"] < 66e9


def test_the_run_is_every_stage_up_to_the_report_with_a_manifest():
    on_gpu = [s.name for s in disk.run_stages("cuda")]
    on_cpu = [s.name for s in disk.run_stages("cpu")]
    assert on_gpu[-1] == "report" and "crossmodel" not in on_gpu  # the cross-model view is a target of its own
    assert "generate" not in on_gpu  # its tables lie in determinism's folder
    gpu_only = {s.name for s in stage_spec.STAGES if s.gpu_only}
    assert gpu_only <= set(on_gpu) and not gpu_only & set(on_cpu)
    assert set(on_gpu) - set(on_cpu) == gpu_only


def test_the_per_stage_figures_sum_to_the_refused_total(tmp_path: Path):
    plan = disk.plan_disk(_run("qwen3-8b"), PROTOCOL, tmp_path / "results", free=lambda _: 0)
    assert plan is not None and plan.to_write == plan.need
    total = sum(plan.need.values())
    with pytest.raises(InputError) as refused:
        disk.check(plan.to_write, plan.free, plan.results)
    assert f"({total} bytes)" in str(refused.value)
    assert "requant/checkpoints 38.5 GB" in str(refused.value)  # the largest items, named by their folders


def test_a_finished_stage_is_not_counted_again(tmp_path: Path):
    results = tmp_path / "results"
    _manifest(results, "model")
    _manifest(results, "requant")
    plan = disk.plan_disk(_run("qwen3-8b"), PROTOCOL, results, free=lambda _: 0)
    assert plan is not None
    assert set(plan.need) - set(plan.to_write) == {"model", "requant"}
    assert sum(plan.to_write.values()) == sum(plan.need.values()) - plan.need["model"] - plan.need["requant"]


def test_free_space_equal_to_the_need_fits_one_byte_less_is_refused_naming_both(tmp_path: Path):
    results = tmp_path / "results"
    need = disk.run_need(_run("qwen3-1.7b"), PROTOCOL)
    assert need is not None
    total = sum(need.values())
    disk.check_disk(_run("qwen3-1.7b"), PROTOCOL, results, free=lambda _: total)
    with pytest.raises(InputError) as refused:
        disk.check_disk(_run("qwen3-1.7b"), PROTOCOL, results, free=lambda _: total - 1)
    line = str(refused.value)
    assert "\n" not in line
    assert f"({total} bytes) under {results}" in line and f"({total - 1} bytes) free" in line
    assert "1 byte short" in line and "results_root" in line


def test_nothing_left_to_write_fits_a_full_disk(tmp_path: Path):
    results = tmp_path / "results"
    for stage in disk.run_stages("cpu"):
        _manifest(results, stage.name)
    disk.check_disk(_run("qwen3-14b", "cpu"), PROTOCOL, results, free=lambda _: 0)


def test_an_unknown_parent_size_is_not_estimated(tmp_path: Path):
    run = {**_run("qwen3-8b"), "model": {"source": "hf", "parent": "$QWEN3_8B_DIR"}}
    assert disk.plan_disk(run, PROTOCOL, tmp_path, free=lambda _: 0) is None
    disk.check_disk(run, PROTOCOL, tmp_path, free=lambda _: 0)  # the model stage stops on it, not the plan


def test_free_space_is_that_of_the_nearest_existing_folder_or_the_variable(tmp_path: Path):
    absent = tmp_path / "not" / "yet" / "results"
    assert abs(disk.free_bytes(absent, env={}) - shutil.disk_usage(tmp_path).free) < 64 * disk.MIB
    assert disk.free_bytes(absent, env={disk.ENV: "1500"}) == 1500 * disk.MIB
    with pytest.raises(InputError, match=re.escape(f"{disk.ENV}: the free space in MiB must be a whole number")):
        disk.free_bytes(absent, env={disk.ENV: "-3"})


def test_sizes_print_so_a_shortfall_is_never_zero():
    assert [disk.size_text(n) for n in (1, 999_999, 2_500_000, 94_728_692_869)] == [
        "1 byte", "999999 bytes", "2.5 MB", "94.7 GB"]
