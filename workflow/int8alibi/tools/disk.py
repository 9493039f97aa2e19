"""``int8alibi disk``: what a config's run writes under its results folder, per stage, before it runs.

The figures are the plan's (``planning.disk``): one Markdown row per ``--configfile``, the stages that
write tensors in columns of their own (the saved parent, the reference, the checkpoints, the captured
operands), the others together; then, per config, what its results folder still lacks against the free
space there (run from the checkout, where Snakemake runs), and whether the plan would refuse it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import load_config, results_location
from ..errors import InputError
from ..planning.disk import TABLES_BYTES, DiskPlan, check, item, plan_disk, size_text
from ..protocol import load


def table(plans: list[tuple[str, str, DiskPlan]]) -> list[str]:
    """Markdown lines: one row per ``(config, size profile, plan)``, every stage's bytes."""
    stages = list(dict.fromkeys(s for _, _, p in plans for s in p.need))  # the spec's order
    order = [s for s in stages if any(p.need.get(s, 0) > TABLES_BYTES for _, _, p in plans)]
    others = max(len(p.need) - len(order) for _, _, p in plans)
    head = ["config", "size profile", *map(item, order), f"other {others} stages (tables)", "total"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + " |"]
    for name, profile, p in plans:
        rest = sum(b for s, b in p.need.items() if s not in order)
        cells = [name, profile, *(size_text(p.need.get(s, 0)) for s in order), size_text(rest),
                 size_text(sum(p.need.values()))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def status(plan: DiskPlan) -> str:
    """One line: what the results folder still lacks, the free space, and the plan's verdict."""
    missing, total = sum(plan.to_write.values()), sum(plan.need.values())
    head = (f"{plan.results}: {size_text(missing)} still to write of {size_text(total)} "
            f"({len(plan.to_write)} of {len(plan.need)} stages unfinished); {size_text(plan.free)} free on its filesystem")
    try:
        check(plan.to_write, plan.free, plan.results)
    except InputError:
        return head + ": the plan refuses it"
    return head + ": fits"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="int8alibi disk", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, action="append", required=True,
                        help="a config (repeat for several; each is one row)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides, as Snakemake's --config (e.g. size_profile=study)")
    args = parser.parse_args(argv)
    protocol = load()
    plans = []
    for path in args.configfile:
        data = load_config(path, args.config).data
        plan = plan_disk(data, protocol, results_location(data))
        if plan is None:
            raise InputError(f"{path}: the parent's size cannot be known before the model stage runs "
                             f"(model {data['model'].get('parent')!r}): nothing to estimate from")
        plans.append((str(path), str(data["size_profile"]), plan))
    for line in table(plans):
        print(line)
    for _, _, plan in plans:
        print(status(plan))
    return 0
