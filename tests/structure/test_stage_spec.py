"""The stage spec (``int8alibi.stage_spec``) is the one home of a stage: every stage module has exactly one
entry and every entry a module and a rule file; each stage's rule takes its outputs from the spec; no other
module writes a stage's output paths, output file names or a table over stage names. Each check is shown
to fire on a planted violation."""

from __future__ import annotations

from pathlib import Path

import yaml

from int8alibi import stage_spec
from int8alibi.planning.floors import stage_work
from int8alibi.planning.resources import held_bytes
from int8alibi.protocol.pins import PROTOCOL_DIR, PROTOCOL_FILES, STAGE_FILES

from . import stage_spec_scan as scan

ROOT = scan.PACKAGE.parent.parent

# Literals the checks allow, each with why; a new one needs a line here.
FILE_NAMES_ELSEWHERE: dict[tuple[str, str], str] = {
    ("int8alibi.analysis.layer_comparison", "layers.parquet"): "compare's domain: the two tables it writes",
    ("int8alibi.analysis.layer_comparison", "summary.parquet"): "the same",
    ("int8alibi.engines.generation", "tokens.parquet"): "generate's domain: the engine writes one run's tokens",
    ("int8alibi.engines.generation", "identity.json"): "the same",
    ("int8alibi.faults.sources", "index.parquet"): "the campaign opens capture's operand index inside a folder "
                                                   "it is given (a shard's or the run's)",
    ("int8alibi.kernels.capture_index", "index.parquet"): "capture's domain: the index format it writes",
    ("int8alibi.model.sources", "parent.parquet"): "model's domain: the parent table beside the parent folder",
    ("int8alibi.quant.gate", "gate.parquet"): "requant's domain: the gate table beside the checkpoints folder",
    ("int8alibi.report.document", "report.md"): "report's domain: the document it renders into its folder",
    ("int8alibi.report.document", "report.html"): "the same",
    ("int8alibi.tools.bench.faults", "cells.parquet"): "a benchmark of the campaign writes the campaign's table "
                                                       "into a scratch folder",
}
# Rule files the Snakefile includes by name; every other one is a stage's, included through the spec.
NOT_STAGE_RULE_FILES: dict[str, str] = {
    "common.smk": "the set-up and helpers every rule file uses",
    "report_figures.smk": "copies of the report's figures for Snakemake's own report: no stage folder, no manifest",
}
TABLES_ELSEWHERE: dict[str, str] = {
    "int8alibi.planning.floors": "stage_work: one arithmetic formula of work per stage whose floor is counted, "
                                 "keyed by the stage it models (its keys are checked against the spec below)",
    "int8alibi.report.summary": "the engine each engine-run stage used, and the two stages whose folders are "
                                "no run input of the report",
    "int8alibi.report.verdicts": "a claim's measure prefix to the stage whose engine it rests on",
    "int8alibi.stages.report": "the report leaves its own folder and the cross-model view's out of its inputs",
}


def test_every_stage_module_has_one_entry_and_every_entry_a_module_and_rule_file() -> None:
    names = [s.name for s in stage_spec.STAGES]
    assert len(names) == len(set(names))
    assert set(names) == scan.stage_modules()
    defined = {f.stem: scan.defined_rules(f.read_text()) for f in scan.RULES.glob("*.smk")}
    for stage in stage_spec.STAGES:
        assert stage.module == f"int8alibi.stages.{stage.name}"
        rules = defined[Path(stage.rules_file).stem]
        assert set(stage.rules) <= set(rules), stage.name
    owners = [r for s in stage_spec.STAGES for r in s.rules]
    assert len(owners) == len(set(owners))  # a rule does one stage's work
    # the Snakefile includes the spec's rule files: one the spec does not name would never be read
    assert set(defined) == {Path(s.rules_file).stem for s in stage_spec.STAGES} | {
        Path(f).stem for f in NOT_STAGE_RULE_FILES}
    snakefile = (ROOT / "workflow" / "Snakefile").read_text()
    assert all(f'include: "rules/{f}"' in snakefile for f in NOT_STAGE_RULE_FILES)


def test_the_spec_is_consistent() -> None:
    names = set(stage_spec.BY_NAME)
    order = [s.name for s in stage_spec.STAGES]
    for stage in stage_spec.STAGES:
        assert all(order.index(u) < order.index(stage.name) for u in stage.requires), stage.name  # topological
        assert not stage.part_of or stage.part_of in names
        assert bool(stage.memory_model) != bool(stage.mem_mb), stage.name  # one memory request
        assert stage.outputs, stage.name
        assert all(f"{PROTOCOL_DIR}/{name}" in PROTOCOL_FILES for name in stage.protocol), stage.name
    assert set(stage_spec.BY_NAME["protocol"].protocol) == {Path(f).name for f in PROTOCOL_FILES}


def test_amendment_schema_enum_equals_the_spec() -> None:
    schema = yaml.safe_load((ROOT / "workflow/schemas/protocol/amendment.schema.yaml").read_text())
    enum = schema["properties"]["stages"]["items"]["enum"]
    assert set(enum) == set(STAGE_FILES) == {s.name for s in stage_spec.STAGES if not s.part_of}


def test_floors_and_memory_models_are_keyed_by_the_spec() -> None:
    from int8alibi.model.size import ModelSize
    from int8alibi.planning.floors import Workload

    size = ModelSize(blocks=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=256, tied=True)
    load = Workload(prefill_tokens=8, prompts=2, new_tokens=4, windows=2, window_tokens=16, replay_windows=1,
                    replay_window_tokens=16, cells_per_layer=6)
    assert set(stage_work(size, load)) <= set(stage_spec.BY_NAME)
    for rule, stage in stage_spec.rule_stages().items():
        if stage.memory_model:  # every memory model the spec names has a formula
            assert held_bytes(rule, size, load) > 0, rule


def test_each_stage_rule_takes_its_outputs_from_the_spec() -> None:
    text = "\n".join(f.read_text() for f in sorted(scan.RULES.glob("*.smk")))
    found = scan.output_blocks(text)
    assert all(s.rules[0] in found for s in stage_spec.STAGES)
    assert scan.outputs_not_from_spec(text) == []


def test_a_rule_with_its_own_outputs_is_found() -> None:
    planted = ('rule batch:\n    input:\n        x="a",\n    output:\n        **stage_outputs("batch"),\n'
               '        extra=update(f"{RESULTS}/batch/extra.parquet"),\n    log:\n        "l",\n')
    assert len(scan.outputs_not_from_spec(planted)) == 1
    assert scan.outputs_not_from_spec(planted.replace('        extra=update(f"{RESULTS}/batch/extra.parquet"),\n',
                                                      "")) == []


def test_no_output_path_outside_the_spec_and_its_stage() -> None:
    found = [v for m, p in scan.package_modules().items() for v in scan.path_literals(m, p.read_text())]
    assert found == []


def test_an_output_path_elsewhere_is_found() -> None:
    planted = 'X = "determinism/agreement.parquet"\nY = f"{root}/faults/cells.parquet"\n'
    assert len(scan.path_literals("int8alibi.report.planted", planted)) == 2
    assert scan.path_literals("int8alibi.stages.determinism", planted[:planted.index("\n")]) == []  # its own


def test_no_output_file_name_outside_the_spec_and_its_stage() -> None:
    every = [(m, v) for m, p in scan.package_modules().items() for v in scan.file_literals(m, p.read_text())]
    assert [v for m, v in every if (m, v.split("'")[1]) not in FILE_NAMES_ELSEWHERE] == []
    used = {(m, v.split("'")[1]) for m, v in every}
    assert [allowed for allowed in FILE_NAMES_ELSEWHERE if allowed not in used] == []  # no stale exception


def test_an_output_file_name_elsewhere_is_found() -> None:
    planted = 'NAME = "agreement.parquet"\nOTHER = "manifest.json"\n'  # every stage's manifest is no one's
    assert len(scan.file_literals("int8alibi.report.planted", planted)) == 1
    assert scan.file_literals("int8alibi.stages.determinism", planted) == []


def test_no_table_over_stage_names_outside_the_spec() -> None:
    modules = scan.package_modules()
    found = [v for m, p in modules.items() if m not in (*TABLES_ELSEWHERE, scan.SPEC_MODULE)
             for v in scan.stage_tables(m, p.read_text())]
    assert found == []
    assert [m for m in TABLES_ELSEWHERE if not scan.stage_tables(m, modules[m].read_text())] == []  # none stale


def test_a_table_over_stage_names_is_found() -> None:
    planted = 'A = ("compare", "tokens")\nB = {"faults": 2, "batch": 1}\nC = config["model"]\nD = ["model"]\n'
    assert [v.split(":")[1] for v in scan.stage_tables("int8alibi.report.planted", planted)] == ["1", "2"]


def test_rule_files_name_no_output_path_or_file() -> None:
    found = [v for f in sorted(scan.RULES.glob("*.smk")) for v in scan.rule_file_literals(f.name, f.read_text())]
    assert found == []


def test_a_rule_file_naming_an_output_is_found() -> None:
    planted = 'rule x:\n    input:\n        f"{RESULTS}/compare/summary.parquet",\n        "check7.parquet",\n'
    assert len(scan.rule_file_literals("planted.smk", planted)) == 2
