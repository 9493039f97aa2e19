"""``int8alibi bench plan``: how long planning takes when there is nothing to do, against Snakemake alone.

Every invocation of the workflow (``-n``, ``--dag``, a run, a cluster job's re-parse) first parses the
Snakefile: the config, the protocol gate, the run config and every rule's rerun params. This times
``snakemake -n --cores N`` in the project (which should hold a finished run, so that nothing is to be
done: the figure is then the whole cost of planning) and, in turn, the same Snakemake on a one-rule
Snakefile with its output present, in a temporary folder: Snakemake's own start-up, the floor of any
workflow. Each is run ``--runs`` times after one warm-up, alternating; the medians of wall and CPU
seconds (the children's user + system time) and their ratio are printed. A dry run that finds work
to do is reported as such (its figure then includes planning those jobs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONE_RULE = 'rule all:\n    output:\n        "done.txt",\n    shell:\n        "touch {output}"\n'
NOTHING = "Nothing to be done"


def _timed(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """``(wall s, CPU s, output)`` of one run of ``command``; a failing command is an error naming it."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"int8alibi bench plan: `{' '.join(command)}` in {cwd} failed:\n{done.stdout}{done.stderr}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, done.stdout + done.stderr


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="int8alibi bench plan", description=__doc__.splitlines()[0])
    p.add_argument("--project", type=Path, default=Path("."), help="the checkout to plan in (default: .)")
    p.add_argument("--runs", type=int, default=5, help="timed runs of each command, after one warm-up (default 5)")
    p.add_argument("--cores", type=int, default=2, help="--cores given to snakemake (default 2)")
    p.add_argument("--snakemake", default=str(Path(sys.executable).with_name("snakemake")),
                   help="the snakemake to time (default: the one beside this interpreter)")
    p.add_argument("args", nargs="*", help="more snakemake arguments for the project's dry run (e.g. --configfile X)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Time both dry runs and print the medians and their ratio."""
    args = _parser().parse_args(argv)
    if args.runs < 1:
        print("int8alibi bench plan: --runs must be at least 1", file=sys.stderr)
        return 2
    workflow = [args.snakemake, "-n", "--cores", str(args.cores), *args.args]
    with tempfile.TemporaryDirectory(prefix="int8alibi-plan-") as tmp:
        floor_dir = Path(tmp)
        (floor_dir / "Snakefile").write_text(ONE_RULE)
        (floor_dir / "done.txt").write_text("")
        floor = [args.snakemake, "-n", "--cores", str(args.cores)]
        runs: dict[str, list[tuple[float, float]]] = {"workflow": [], "one rule": []}
        output = ""
        for i in range(args.runs + 1):
            wall, cpu, output = _timed(workflow, args.project)
            floor_wall, floor_cpu, _ = _timed(floor, floor_dir)
            if i:  # the first pair warms caches (the workflow's plan caches among them)
                runs["workflow"].append((wall, cpu))
                runs["one rule"].append((floor_wall, floor_cpu))
    med = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in runs.items()}
    print(f"dry run, median of {args.runs} after a warm-up, --cores {args.cores}, {os.cpu_count()} CPUs here")
    print(f"  {'':<10} {'wall s':>8} {'cpu s':>8}")
    for name, (wall, cpu) in med.items():
        print(f"  {name:<10} {wall:>8.3f} {cpu:>8.3f}")
    (w, c), (fw, fc) = med["workflow"], med["one rule"]
    print(f"  {'ratio':<10} {w / fw:>8.2f} {c / fc:>8.2f}   (workflow / one-rule Snakefile, same snakemake)")
    if NOTHING not in output:
        print("  note: the workflow's dry run found jobs to do; the figure includes planning them "
              "(time a finished run for the cost of planning alone)")
    return 0
