"""What the Snakefile decides once per invocation (``int8alibi.snakefile.workflow_plan``): the config read
strictly and checked before anything trusts it, the run config resolved once and reused, and the
run's folders, targets and job environments."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from int8alibi import stage_spec
from int8alibi.snakefile import workflow_plan as wp
from int8alibi.errors import InputError, Int8AlibiError, ProtocolError

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the protocol outside git, as the working folder."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "checkout"
    for rel in ("preregistration", "amendments"):
        shutil.copytree(PROJECT / rel, root / rel)
    monkeypatch.chdir(root)
    return root


def user_config(root: Path, text: str | None = None, **overrides: object) -> tuple[dict, Path]:
    data = yaml.safe_load((PROJECT / "config" / "config.yaml").read_text())
    data.update(overrides)
    path = root / "config.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return data, path


def test_a_good_config_gives_its_results_folder_and_the_gate(checkout: Path) -> None:
    data, path = user_config(checkout, exploratory="true")
    results, gate = wp.checked_config(data, [path], {"exploratory": "true"}, checkout)
    assert results == "results" and data["exploratory"] is True  # typed as the schema says, in place
    assert gate.protocol.size_profile("default-cpu")


def test_each_check_stops_planning_naming_what_failed(checkout: Path) -> None:
    data, path = user_config(checkout)
    duplicate = path.read_text() + "device: cpu\n"
    _, twice = user_config(checkout, duplicate)
    with pytest.raises(InputError, match="device"):
        wp.checked_config(data, [twice], {}, checkout)  # a duplicate key Snakemake's loader let through
    with pytest.raises(InputError, match=r"config \(after --configfile/--config\): invalid config at device"):
        wp.checked_config({**data, "device": "tpu"}, [], {}, checkout)
    (checkout / "out").symlink_to(checkout.parent, target_is_directory=True)
    with pytest.raises(InputError, match="results 'out/r' resolves to .*outside the checkout"):
        wp.checked_config({**data, "results": "out/r"}, [], {}, checkout)
    with pytest.raises(Int8AlibiError, match="no-such-profile"):
        wp.checked_config({**data, "size_profile": "no-such-profile"}, [], {}, checkout)
    (checkout / "preregistration" / "checks.yaml").write_text("edited: after the pin\n")
    with pytest.raises(ProtocolError, match="checks.yaml"):
        wp.checked_config(data, [], {}, checkout)


def test_the_run_plan_expands_resolves_and_reports_unset_variables(checkout: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_VARIABLE_HERE", raising=False)
    data, _ = user_config(checkout, device="cpu", arms=["exact-cutlass-order", "exact-triton-order"],
                          corpus={"source": "wikitext", "path": "${NO_SUCH_VARIABLE_HERE}/wiki.txt"})
    first = wp.run_plan(data, "results")
    assert first.path.startswith("results/.run/") and first.path.endswith("/config.yaml")
    assert first.run["resolved"]["device"] == "cpu" and first.run["resolved"]["spec"]["device"] == "cpu"
    assert first.unset == ["corpus.path: ${NO_SUCH_VARIABLE_HERE}"]
    assert wp.run_plan(data, "results") == first  # planning again decides the same


def swap_arms(run_config: Path) -> None:
    """The edit of issue 45: the resolved block's two arms swapped by hand, the file otherwise as written."""
    text = run_config.read_text()
    assert "  - exact-cutlass-order\n  - exact-triton-order\n" in text
    run_config.write_text(text.replace("  - exact-cutlass-order\n  - exact-triton-order\n",
                                       "  - exact-triton-order\n  - exact-cutlass-order\n"))


def test_a_run_config_edited_after_it_was_written_is_refused_not_rechosen(checkout: Path) -> None:
    data, _ = user_config(checkout, device="cpu", arms="auto")
    planned = wp.run_plan(data, "results")
    wp.write_run(planned.run, planned.path)  # what a run's onstart writes: the file and its digest
    written = Path(planned.path)
    assert wp.seal_path(written).read_text() == f"{hashlib.sha256(written.read_bytes()).hexdigest()}\n"
    assert wp.run_plan(data, "results") == planned  # read again as written
    swap_arms(written)
    with pytest.raises(InputError) as refused:
        wp.run_plan(data, "results")
    message = str(refused.value)
    assert message.startswith(f"{written}: this run config was edited after it was written") and "\n" not in message
    assert "delete its folder to plan the run again" in message
    # another config reuses the last executing run's resolution (.run/current): that file is checked too
    other, _ = user_config(checkout, device="cpu", arms="auto", exploratory=True)
    with pytest.raises(InputError, match=f"^{written}: this run config was edited"):
        wp.run_plan(other, "results")
    shutil.rmtree(written.parent)  # as the message says: planned afresh
    assert wp.run_plan(data, "results") == planned


def test_a_run_config_written_before_seals_is_read_and_sealed_by_its_next_run(checkout: Path) -> None:
    data, _ = user_config(checkout, device="cpu", arms="auto")
    planned = wp.run_plan(data, "results")
    wp.write_run(planned.run, planned.path)
    written = Path(planned.path)
    wp.seal_path(written).unlink()
    assert wp.run_plan(data, "results") == planned
    wp.write_run(planned.run, planned.path)  # the file is not rewritten; the digest of its bytes is added
    assert wp.seal_path(written).read_text() == f"{hashlib.sha256(written.read_bytes()).hexdigest()}\n"


def test_folders_targets_and_environments_of_a_run() -> None:
    cpu = {"resolved": {"device": "cpu"}}
    cuda = {"resolved": {"device": "cuda"}}
    assert wp.side_folders({"results": "results"}, "results") == ("logs", "benchmarks")
    assert wp.side_folders({"results": "results/qwen3-8b"}, "results/qwen3-8b") == ("logs/qwen3-8b",
                                                                                    "benchmarks/qwen3-8b")
    reported = [s for s in stage_spec.STAGES if s.reported]
    assert wp.report_inputs("r", cpu) == [f"r/{s.name}/manifest.json" for s in reported if not s.gpu_only]
    assert wp.report_inputs("r", cuda)[-1] == "r/ksweep/manifest.json"  # GPU only: last, and only on CUDA
    assert sorted(wp.report_inputs("r", cuda)) == sorted(f"r/{s.name}/manifest.json" for s in reported)
    assert wp.software_env(cpu, gpu_capable=True) == "../envs/cpu.yaml"
    assert wp.software_env(cuda, gpu_capable=True) == "../envs/gpu.yaml"
    assert wp.software_env(cuda) == "../envs/cpu.yaml"


def test_deleted_paths_list_each_match_as_a_file_or_a_folder(tmp_path: Path) -> None:
    (tmp_path / "parent").mkdir()
    (tmp_path / "b.svg").write_text("")
    (tmp_path / "a.svg").write_text("")
    found = wp.deleted_paths({"folder": f"{tmp_path}/parent", "figure": f"{tmp_path}/*.svg",
                              "none": f"{tmp_path}/missing"})
    assert found == {"folder_0": (f"{tmp_path}/parent", True), "figure_0": (f"{tmp_path}/a.svg", False),
                     "figure_1": (f"{tmp_path}/b.svg", False)}


def test_the_crossmodel_view_needs_named_runs() -> None:
    assert wp.crossmodel_manifests(["results/a", "results/b"]) == ["results/a/report/manifest.json",
                                                                  "results/b/report/manifest.json"]
    for none in (None, []):
        with pytest.raises(InputError, match="crossmodel=\\[results/qwen3-1.7b"):
            wp.crossmodel_manifests(none)
