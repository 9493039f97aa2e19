"""The table of what each stage reads (``int8alibi.planning.stage_needs``) and the checkpoint variants: one
entry per stage module, only keys and roles that exist, readable at plan time without heavy imports,
and the rules take both from there instead of keeping lists of their own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from int8alibi.planning.stage_needs import READS_LINE, SOURCE_ROLES, STAGES, UNDIGESTED_KEYS, never_read
from int8alibi.snakefile.rerun import source_files

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())["properties"]


def test_declared_keys_and_roles_exist() -> None:
    for stage, needs in STAGES.items():
        assert set(needs.config) <= set(SCHEMA) - {"resolved"}, stage
        assert not set(needs.config) & set(UNDIGESTED_KEYS), stage  # a free key is never digested
        assert len(set(needs.config)) == len(needs.config), stage
        assert set(needs.sources) <= set(SOURCE_ROLES), stage
    assert set(UNDIGESTED_KEYS) <= set(SCHEMA)


def test_stages_that_sum_floats_on_the_host_are_pinned_to_one_thread_and_rule_threads_follow() -> None:
    from int8alibi.portable import FORWARD_THREADS

    pinned = {"capture", "generate", "prefill_decode", "perplexity", "tokens", "prediction", "compare", "faults", "batch"}
    assert {s for s, needs in STAGES.items() if needs.pinned} == pinned
    for stage, needs in STAGES.items():
        assert needs.threads == (FORWARD_THREADS if stage in pinned else needs.cpu_threads), stage


def test_source_roles_are_the_roles_source_files_lists() -> None:
    config = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny"}}, "corpus": {"source": "synthetic"}}
    assert tuple(source_files(config)) == SOURCE_ROLES


def test_the_table_and_the_variants_import_nothing_heavy() -> None:
    code = ("import sys; import int8alibi.planning.stage_needs, int8alibi.quant.variants, int8alibi.snakefile.rule_commands; "
            "heavy = {'torch', 'numpy', 'pandas', 'pyarrow', 'yaml', 'jsonschema'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "workflow")})
    assert out.stdout.strip() == "[]"


def test_rules_keep_no_list_of_config_keys_checkpoints_or_threads_of_their_own() -> None:
    """Every `stage_params` call names a stage only; threads and the checkpoint wildcard come from the
    tables (one rule, the faults gather, declares its own single thread: it only concatenates)."""
    rules = {p.name: p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk")}
    calls = [(name, line.strip()) for name, text in rules.items() if name != "common.smk"
             for line in text.splitlines() if "stage_params(" in line]
    plain = [re.fullmatch(r'\*\*stage_params\("(\w+)"(?:, environment=lock_param\(\))?\),', line) for _, line in calls]
    assert calls and all(plain), calls
    assert {m.group(1) for m in plain if m} == set(STAGES)
    literal = [(name, line) for name, text in rules.items() for line in text.splitlines()
               if re.match(r"\s*threads: \d", line)]
    assert literal == [("faults.smk", "        threads: 1"), ("report_figures.smk", "    threads: 1")]
    assert not any('"pow2-nearest"' in text for text in rules.values())


def test_a_declared_key_no_job_read_is_found_in_the_logs() -> None:
    """The slow DAG test reads the logs of a finished run with this; here a planted over-declaration."""
    generate_1 = "x INFO " + READS_LINE % ("generate", "device, model, size_profile", "none")
    generate_2 = "x INFO " + READS_LINE % ("generate", "device, model, results", "size_profile")
    assert never_read([generate_1, generate_2, "unrelated line"]) == {"generate": []}
    prediction = "x INFO " + READS_LINE % ("prediction", "none", "device")
    assert never_read([prediction, "x INFO " + READS_LINE % ("not-a-stage", "none", "none")]) == \
        {"prediction": ["device"]}
