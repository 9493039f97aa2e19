"""A rule's command, filled in the way Snakemake fills it, gives the stage exactly the arguments
written: paths with spaces, both quote characters, ``$``, backquotes and braces arrive unchanged,
and the shell runs nothing of them."""

from __future__ import annotations

import shlex
import subprocess
from types import SimpleNamespace

import pytest
from snakemake.utils import format as snakemake_format

from int8alibi.snakefile.rule_commands import q, qpath, stage_cmd

HOSTILE = [
    "results",
    "my results/run 1",
    "it's \"quoted\"",
    "$HOME and $(touch pwned) and `touch pwned`",
    "braces {0} {{x}} {name} }{",
    "semi;colon & amp | pipe > gt",
    "-leading-dash",
    "tab\there",
]


def fill(command: str, **values: str) -> str:
    """``command`` as Snakemake's job formatting gives it (placeholders quoted under ``:q``)."""
    return snakemake_format(command, params=SimpleNamespace(python=values.get("python", "py"),
                                                           run_config=values.get("run_config", "run.yaml")),
                            input=SimpleNamespace(gate=values.get("gate", "gate.parquet")),
                            wildcards=SimpleNamespace(arm=values.get("arm", "arm")),
                            resources=SimpleNamespace(gpu_mem_mb=values.get("gpu_mem_mb", "0")),
                            log=values.get("log", "x.log"))


def test_q_gives_each_placeholder_the_quote_format_and_leaves_text_and_formats_alone() -> None:
    assert q("--input gate={input.gate} --param arm={wildcards.arm}") == \
        "--input gate={input.gate:q} --param arm={wildcards.arm:q}"
    assert q("{log}") == "{log:q}" and q("{params.x:q}") == "{params.x:q}" and q("{other}") == "{other}"
    assert q("") == ""


@pytest.mark.parametrize("path", HOSTILE)
def test_a_literal_path_reaches_the_stage_as_one_unchanged_argument(path: str) -> None:
    assert shlex.split(fill(qpath(path))) == [path]


@pytest.mark.parametrize("value", HOSTILE)
def test_placeholders_in_a_path_are_filled_and_quoted_by_snakemake(value: str) -> None:
    assert shlex.split(fill(qpath("runs/{wildcards.arm}/out dir"), arm=value)) == [f"runs/{value}/out dir"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_stage_command_parses_back_to_the_arguments_it_names(value: str) -> None:
    command = stage_cmd("capture", f"{value}/capture", "--input gate={input.gate}") + " 2> {log:q}"
    filled = fill(command, python=value, run_config=f"{value}/.run/c.yaml", gate=f"{value}/gate.parquet",
                  log=f"{value}.log", gpu_mem_mb="12288")
    assert shlex.split(filled) == [value, "-m", "int8alibi.stages.capture", "--config", f"{value}/.run/c.yaml",
                                   "--out", f"{value}/capture", "--gpu-mem-mb", "12288", "--input",
                                   f"gate={value}/gate.parquet", "2>", f"{value}.log"]


def test_the_shell_runs_nothing_inside_a_value(tmp_path) -> None:
    """The real shell, not only shlex: `$(...)`, backquotes and `;` stay text."""
    value = "a $(touch made1) `touch made2`; touch made3 {x}"
    command = fill(f"printf '%s\\n' {qpath(value)} {{input.gate:q}}", gate=value)
    out = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [value, value]
    assert list(tmp_path.iterdir()) == []


def test_no_extra_and_another_interpreter() -> None:
    assert stage_cmd("protocol", "results/protocol") == \
        "{params.python:q} -m int8alibi.stages.protocol --config {params.run_config:q} --out results/protocol"
    assert stage_cmd("requant", "r").endswith(" --out r --gpu-mem-mb {resources.gpu_mem_mb:q}")  # a GPU stage
    assert stage_cmd("reference", "r", python=".venv-llmcompressor/bin/python").startswith(
        ".venv-llmcompressor/bin/python -m int8alibi.stages.reference ")
