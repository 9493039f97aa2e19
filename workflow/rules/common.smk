# Set-up shared by every rule: config validation, the fail-closed protocol gate, helpers.
# No stage logic lives here: rules call int8alibi.stages.<stage>.
import sys
from pathlib import Path

ROOT = Path(workflow.basedir)
sys.path.insert(0, str(ROOT / "workflow"))

from int8alibi.config import validate, write_effective_config
from int8alibi.errors import Int8AlibiError
from int8alibi.protocol import STAGE_FILES, gate
from int8alibi.workflow_support import code_digest, config_digest, selected_arm_names, shard_ranges, use_gpu


def _stop(exc):
    sys.stderr.write(f"int8alibi: {exc}\n")
    raise SystemExit(1)


try:
    validate(config, "config (after --configfile/--config)")
    GATE = gate(ROOT)
except Int8AlibiError as exc:
    _stop(exc)

RESULTS = config.get("results", "results")
# One results folder per config (results/, results/qwen3-8b, ...): logs and benchmarks follow it.
_RUN = "" if RESULTS == "results" else "/" + Path(RESULTS).name
LOGS = f"logs{_RUN}"
BENCHMARKS = f"benchmarks{_RUN}"
# The stages read the effective config (file + --config overrides) from one file, rewritten only
# when its content changes so that it never triggers reruns by itself.
RUN_CONFIG = write_effective_config(config, ROOT / RESULTS / ".run" / "config.yaml")


def protocol_files(stage):
    """The protocol files a stage reads: an amendment touching one reruns exactly those stages."""
    return [f"preregistration/{name}" for name in STAGE_FILES[stage]]


def stage_cmd(stage, out, extra=""):
    """The one-line call a rule makes."""
    return (
        f"{sys.executable} -m int8alibi.stages.{stage} --config {RUN_CONFIG} --out {out} {extra}"
    )


try:
    ARMS = selected_arm_names(config)
except Int8AlibiError as exc:
    _stop(exc)

# What the report reads (and so what rule all builds): every stage's manifest.
STAGES_IN_RUN = ["protocol", "requant", "compare", "faults", "determinism", "perplexity", "tokens"]
REPORT_INPUTS = [f"{RESULTS}/{stage}/manifest.json" for stage in STAGES_IN_RUN]


def final_targets():
    return [f"{RESULTS}/report/report.md", f"{RESULTS}/report/report.html"]
