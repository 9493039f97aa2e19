"""What each stage reads besides its input files, in one table both sides use (derived from
``int8alibi.stage_spec``, where each stage declares it).

The rules digest exactly a stage's ``config`` keys and ``sources`` (so changing a key reruns the
stages that read it and no other) and take its ``threads``; the stage runner (``int8alibi.stages``)
lets the stage read only those keys (``int8alibi.config.ReadScope``: reading another one stops the
stage, naming the key and this table) and pins torch to one intra-op thread where ``forward`` says.
Planning reads this module on every invocation, dry runs included: it imports nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .. import stage_spec
from ..portable import FORWARD_THREADS

# Keys any stage may read without its rule digesting them, each with why no output byte depends on
# it: a change can only make a stage fail or succeed, or move its outputs to another path (which
# Snakemake sees as other files).
UNDIGESTED_KEYS: dict[str, str] = {
    "user_arm_time_limit_s": "a time limit on a user arm's call: the call gives the same bytes or stops the stage",
    "gpu_budget_mb": "how much device memory a stage holds at once: chunks of a shape the protocol fixes, the same "
                     "bytes under any budget (tests/stages/test_budget.py)",
    "gpus": "which of the run's devices a GPU job is pinned to: they are cards of one model (planning.resolve."
            "resolve_gpus), each job its own process computing the same thing, its device recorded in its manifest",
    "results": "where the stage folders lie: another value is another set of output paths",
    "results_root": "where the stage folders lie: another value is another set of output paths",
}
# Source-file roles (``int8alibi.snakefile.rerun.source_files``).
SOURCE_ROLES = ("parent", "checkpoint", "corpus")


@dataclass(frozen=True)
class StageNeeds:
    """One stage: the top-level config keys it reads, the source-file roles it reads, its threads."""

    config: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    forward: bool = False
    cpu_threads: int = 2
    float_statistics: bool = False  # sums float64 statistics of layer outputs on the host

    @property
    def pinned(self) -> bool:
        """Whether torch runs on ``portable.FORWARD_THREADS`` intra-op threads: a float forward pass
        or float statistics, whose sums are split by thread and so give other bytes under another
        thread count (compare's RMS columns did, at 1 thread against 2, on a 2-core CPU)."""
        return self.forward or self.float_statistics

    @property
    def threads(self) -> int:
        """The rule's ``threads:`` (a ceiling Snakemake caps to --cores): a pinned stage's one thread,
        so Snakemake runs such jobs side by side (the analysis chain beside the forward jobs), else
        ``cpu_threads``."""
        return FORWARD_THREADS if self.pinned else self.cpu_threads


STAGES: dict[str, StageNeeds] = {
    s.name: StageNeeds(s.config, s.sources, s.forward, s.cpu_threads, s.float_statistics) for s in stage_spec.STAGES
}


def needs(stage: str) -> StageNeeds:
    """The table's entry for ``stage``; a name it does not hold is a KeyError naming the table."""
    try:
        return STAGES[stage]
    except KeyError:
        raise KeyError(f"stage {stage!r} is not in int8alibi.stage_spec.STAGES") from None


# The line a stage's log ends with (``int8alibi.stages.log_reads``).
READS_LINE = "%s: config keys read: %s; declared, not read in this run: %s"
_READS = re.compile(r"(\w+): config keys read: ([^;\n]*); declared, not read in this run: ")


def never_read(logs: Iterable[str]) -> dict[str, list[str]]:
    """``{stage: declared keys}`` that no job of the stage read, over the logs of a run's jobs; a stage
    with no log in them is left out (it did not run)."""
    read: dict[str, set[str]] = {}
    for text in logs:
        for stage, keys in _READS.findall(text):
            read.setdefault(stage, set()).update(k for k in keys.split(", ") if k != "none")
    return {stage: sorted(set(STAGES[stage].config) - keys) for stage, keys in read.items() if stage in STAGES}
