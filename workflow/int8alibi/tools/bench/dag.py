"""``int8alibi bench dag RESULTS``: per stage of a finished run, its seconds, peak host and device
memory, and its floor (``int8alibi.planning.floors``) with the ratio seconds / floor.

Seconds and peak host memory (``max_rss``) come from the benchmark files Snakemake writes for
every job (``benchmarks/<name>/<stage>.tsv``, one file per job for generate and fault shards: their
seconds are summed, their memory maximised); device memory from the line stages log at their end
(``runtime.device_memory``). A sub-folder of either named after no stage holds another run's
files (``benchmarks/<name>`` of a run kept in ``results/<name>``): it is left out, and named. The
parent's shape is read from the run's saved parent (its config.json), the size profile and device
from the run config, the sizes from the protocol. Rates default to the H200 for a CUDA run and to a
2-core CPU otherwise; each can be given.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...config import current_run_config, read_run_config
from ...errors import InputError
from ...planning.floors import RATES, Rates, Work, Workload, stage_work
from ...planning.stage_needs import STAGES
from ...model.size import ModelSize, model_size, read_hf_config
from ...runtime.device_memory import peak_reserved_bytes

MIB = 1 << 20


@dataclass(frozen=True)
class StageRun:
    """What Snakemake measured for one stage: its jobs, their summed seconds, the largest RSS."""

    jobs: int
    seconds: float
    max_rss_mib: float | None


def _number(value: str, file: Path, column: str) -> float | None:
    if value.strip() in ("", "NA", "-"):
        return None
    try:
        number = float(value)
    except ValueError as exc:
        raise InputError(f"{file}: column {column!r} is {value!r}, not a number") from exc
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{file}: column {column!r} is {value!r}, not a finite number >= 0")
    return number


def _read_tsv(file: Path) -> tuple[float, float | None]:
    """(mean seconds, largest max_rss) over the rows of one Snakemake benchmark file."""
    with file.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if not rows or "s" not in rows[0] or "max_rss" not in rows[0]:
        raise InputError(f"{file}: not a Snakemake benchmark file (needs a header with 's' and 'max_rss' and a row)")
    seconds = [_number(r["s"], file, "s") for r in rows]
    if any(s is None for s in seconds):
        raise InputError(f"{file}: a row has no seconds")
    rss = [v for r in rows if (v := _number(r["max_rss"], file, "max_rss")) is not None]
    return sum(s for s in seconds if s is not None) / len(seconds), max(rss) if rss else None


def stage_of(relative: Path) -> str:
    """The stage a benchmark or log file belongs to: its top-level name (``model.tsv``: model;
    ``generate/<job>.tsv``: generate; ``faults/shard_0_8.tsv``: faults)."""
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def other_runs(folder: Path) -> list[Path]:
    """Sub-folders of a benchmarks or logs folder named after no stage (only generate/ and faults/ hold
    one file per job): another run's, ``benchmarks/<name>`` of a run kept in ``results/<name>``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in STAGES)


def _own_files(folder: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` under ``folder`` that belong to this run's jobs (not ``other_runs``)."""
    others = other_runs(folder)
    return [f for f in sorted(Path(folder).rglob(pattern)) if not any(o in f.parents for o in others)]


def read_benchmarks(folder: Path) -> dict[str, StageRun]:
    """Stage -> ``StageRun`` from every ``*.tsv`` of this run's jobs under ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no benchmarks folder (Snakemake writes one per run; see --benchmarks)")
    runs: dict[str, StageRun] = {}
    for file in _own_files(folder, "*.tsv"):
        stage = stage_of(file.relative_to(folder))
        seconds, rss = _read_tsv(file)
        before = runs.get(stage, StageRun(0, 0.0, None))
        peaks = [v for v in (before.max_rss_mib, rss) if v is not None]
        runs[stage] = StageRun(before.jobs + 1, before.seconds + seconds, max(peaks) if peaks else None)
    if not runs:
        raise InputError(f"{folder}: no benchmark files (*.tsv)")
    return runs


def read_device_peaks(folder: Path) -> dict[str, int]:
    """Stage -> the largest peak reserved device memory its logs under ``folder`` record."""
    peaks: dict[str, int] = {}
    if not Path(folder).is_dir():
        return peaks
    for file in _own_files(folder, "*.log"):
        value = peak_reserved_bytes(file)
        if value is not None:
            stage = stage_of(file.relative_to(folder))
            peaks[stage] = max(value, peaks.get(stage, 0))
    return peaks


def run_facts(results: Path) -> tuple[dict[str, Any], ModelSize]:
    """The run config of ``results`` and its parent's size (the saved parent's config.json if present)."""
    path = current_run_config(results)
    data = read_run_config(path) if path is not None else None
    if data is None:
        raise InputError(f"{results}: no run config (.run/current); not the results folder of a run")
    saved = Path(results) / "model" / "parent" / "config.json"
    return data, read_hf_config(saved) if saved.is_file() else model_size(data["model"])


@dataclass(frozen=True)
class Row:
    stage: str
    run: StageRun | None
    device_peak_mib: float | None
    work: Work | None
    floor: float | None
    limit: str | None

    @property
    def ratio(self) -> float | None:
        if self.run is None or not self.floor:
            return None
        return self.run.seconds / self.floor


def dag_rows(runs: dict[str, StageRun], peaks: dict[str, int], size: ModelSize, load: Workload,
             rates: Rates) -> list[Row]:
    """One row per stage that was benchmarked or has a floor, stages with a floor first, in DAG order."""
    works = stage_work(size, load)
    order = list(works) + sorted(set(runs) - set(works))
    rows = []
    for stage in order:
        work = works.get(stage)
        rows.append(Row(stage, runs.get(stage), peaks[stage] / MIB if stage in peaks else None, work,
                        work.seconds(rates) if work else None, work.limit(rates) if work else None))
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_rows(rows: list[Row], size: ModelSize) -> str:
    """The Markdown table, then the sum of job seconds (jobs run side by side: not the wall time)."""
    parent_mib = size.parent_bytes / MIB
    lines = ["| stage | jobs | seconds | host peak MiB | host peak / parent | device peak MiB | floor s "
             "| floor set by | seconds / floor |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        rss = r.run.max_rss_mib if r.run else None
        lines.append(f"| {r.stage} | {r.run.jobs if r.run else 0} | {_fmt(r.run.seconds if r.run else None, '.1f')} "
                     f"| {_fmt(rss, '.0f')} | {_fmt(None if rss is None else rss / parent_mib, '.2f')} "
                     f"| {_fmt(r.device_peak_mib, '.0f')} | {_fmt(r.floor, '.3g')} | {r.limit or 'n/a'} "
                     f"| {_fmt(r.ratio, '.1f')} |")
    total = sum(r.run.seconds for r in rows if r.run)
    lines.append(f"\nSum of job seconds: {total:.1f} (jobs may overlap; the DAG's wall time is at most this).")
    return "\n".join(lines)


RATE_OPTIONS = {"device_bw": "device memory, B/s", "device_flops": "device FLOP/s", "host_bw": "host memory, B/s",
                "host_flops": "host FLOP/s", "link": "host to device, B/s", "disk_read": "disk read, B/s",
                "disk_write": "disk write, B/s"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="int8alibi bench dag", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a run's results folder, e.g. results/synthetic-qwen3-1.7b")
    parser.add_argument("--benchmarks", type=Path, default=None,
                        help="default: benchmarks/ (results/) or benchmarks/<name> (results/<name>), from here")
    parser.add_argument("--logs", type=Path, default=None, help="default: logs/ or logs/<name>, as --benchmarks")
    parser.add_argument("--protocol", type=Path, default=Path("preregistration"), help="the protocol folder")
    parser.add_argument("--rates", choices=sorted(RATES), default=None,
                        help="default: h200 for a CUDA run, cpu otherwise; " + "; ".join(
                            f"{n}: " + ", ".join(f"{k}={v:.3g}" for k, v in vars(r).items()) for n, r in RATES.items()))
    for name, text in RATE_OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help=text)
    args = parser.parse_args(argv)
    from ...protocol import load

    data, size = run_facts(args.results)
    device = (data.get("resolved") or {}).get("device", "cpu")
    rates = RATES[args.rates or ("h200" if device == "cuda" else "cpu")]
    rates = replace(rates, **{k: getattr(args, k) for k in RATE_OPTIONS if getattr(args, k) is not None})
    protocol = load(args.protocol)
    work = Workload.from_protocol(protocol.analysis, protocol.tokens, protocol.faults, data["size_profile"])
    folder = [] if args.results.name == "results" else [args.results.name]
    benchmarks, logs = args.benchmarks or Path("benchmarks", *folder), args.logs or Path("logs", *folder)
    runs = read_benchmarks(benchmarks)
    peaks = read_device_peaks(logs)
    print(f"{args.results}: parent {size.params / 1e9:.3g} B parameters ({size.parent_bytes / 1e9:.2f} GB bf16, "
          f"checkpoint {size.checkpoint_bytes / 1e9:.2f} GB), size profile {data['size_profile']}, device {device}; "
          "rates " + ", ".join(f"{k}={v:.3g}" for k, v in vars(rates).items()))
    left_out = [p.as_posix() for p in (*other_runs(benchmarks), *other_runs(logs))]
    if left_out:
        print(f"left out: {', '.join(left_out)} (named after no stage: another run's, kept in results/<name>; "
              "run bench dag on that run)")
    print(format_rows(dag_rows(runs, peaks, size, work, rates), size))
    return 0
