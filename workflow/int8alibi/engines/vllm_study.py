"""The papers' vLLM treatment on one GPU host, through the project's own stages, without Snakemake.

For a host that has vLLM (carried there with ``dev/device-vllm``) but not the workflow manager:
plans a run config for the vLLM arm pair, then runs the stages the DAG would run for the
determinism table in the same order and with the same arguments (model -> requant -> generate x
arm x checkpoint x run -> determinism), each as its own process. The requant gate has no
independent reference here (no llm-compressor), so it is labelled self-built, as the stage
labels it. Generate jobs into different folders run side by side (each a fresh vLLM process on
the same GPU); a stage whose manifest is already there is not run again, so a call cut short
continues where it stopped. At the end it prints the agreement per checkpoint, each arm's
self-consistency and the kernel class vLLM logged for every artifact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import RESOLVED, earlier_plan, expand_env, run_config_path, validate, write_run_config
from ..errors import Int8AlibiError
from .. import strict_yaml
from ..quant.variants import CHECKPOINT_VARIANTS
from .generation import RUNS, artifact_dir, artifact_paths
from .vllm_engine import ARM_KERNELS

ARMS = list(ARM_KERNELS)


def plan_run_config(config_file: Path, results: str) -> Path:
    """The run config for the vLLM pair on CUDA, written once under ``<results>/.run/``."""
    from ..planning.resolve import plan

    data = strict_yaml.read(config_file)
    data.update({"device": "cuda", "arms": list(ARMS), "engine": "vllm", "results": results})
    expanded, unset = expand_env(data)
    if unset:
        raise Int8AlibiError(f"{config_file}: environment variable(s) not set: {', '.join(unset)}")
    validate(expanded, str(config_file))
    path = run_config_path(results, expanded)
    run = plan(expanded, earlier_plan(path, results, expanded))
    if run[RESOLVED]["arms"] != ARMS:
        raise Int8AlibiError(f"{path}: planned arms {run[RESOLVED]['arms']}, expected {ARMS}")
    write_run_config(run, path)
    return Path(path)


def _stage(name: str, run_config: Path, out: Path, extra: Sequence[str], log: Path) -> None:
    argv = [sys.executable, "-m", f"int8alibi.stages.{name}", "--config", str(run_config), "--out", str(out), *extra]
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        done = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
        raise Int8AlibiError(f"{log}: stage {name} failed (status {done.returncode}) after {took:.0f} s:\n{tail}")
    print(f"[{time.strftime('%H:%M:%S')}] {name} {out}: done in {took:.0f} s", flush=True)


def _generate_folder(run_config: Path, results: Path, logs: Path, arm: str, checkpoint: str) -> None:
    for k in RUNS:  # one after the other: the second run is a second cold start on the same arm
        out = artifact_dir(results / "determinism" / "runs", arm, checkpoint, k)
        if artifact_paths(out)[1].is_file():
            continue
        _stage("generate", run_config, out,
               ["--input", f"gate={results / 'requant' / 'gate.parquet'}", "--param", f"arm={arm}",
                "--param", f"checkpoint={checkpoint}", "--param", f"run={k}", "--param", "engine=vllm"],
               logs / f"generate_{arm}_{checkpoint}_{k}.log")


def run_study(run_config: Path, results: Path, logs: Path, parallel: int) -> None:
    """Every stage up to the determinism table, skipping those whose outputs are complete."""
    if not (results / "model" / "manifest.json").is_file():
        _stage("model", run_config, results / "model", [], logs / "model.log")
    if not (results / "requant" / "manifest.json").is_file():
        _stage("requant", run_config, results / "requant",
               ["--input", f"parent={results / 'model' / 'parent.parquet'}"], logs / "requant.log")
    jobs = [(arm, c) for c in CHECKPOINT_VARIANTS for arm in ARMS]
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for future in [pool.submit(_generate_folder, run_config, results, logs, arm, c) for arm, c in jobs]:
            future.result()
    _stage("determinism", run_config, results / "determinism",
           ["--input", f"runs={results / 'determinism' / 'runs'}"], logs / "determinism.log")


def report(results: Path) -> dict[str, Any]:
    """What the determinism stage wrote, in the papers' terms, from its own tables and identities."""
    import pandas as pd

    agreement = pd.read_parquet(results / "determinism" / "agreement.parquet")
    summary = pd.read_parquet(results / "determinism" / "summary.parquet").iloc[0].to_dict()
    counts: dict[str, dict[str, str]] = {}
    for (checkpoint, comparison), rows in agreement.groupby(["checkpoint", "comparison"], sort=True):
        counts.setdefault(str(checkpoint), {})[str(comparison)] = f"{int(rows['identical'].sum())}/{len(rows)}"
    kernels: dict[str, Any] = {}
    for arm in ARMS:
        for c in CHECKPOINT_VARIANTS:
            for k in RUNS:
                ident = json.loads(artifact_paths(artifact_dir(results / "determinism" / "runs", arm, c, k))[1].read_text())
                kernels[f"{arm}/{c}/run{k}"] = ident["kernel_evidence"].get("selected")
    return {"agreement": counts, "identity": summary["identity"], "self_consistent": summary["self_consistent"],
            "kernels": kernels}


def copy_logs(results: Path, target: Path) -> list[Path]:
    """One vLLM log per arm (own checkpoint, run 1): the fixture the log-parsing tests read."""
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for arm in ARMS:
        log = artifact_dir(results / "determinism" / "runs", arm, "own", 1) / "vllm" / f"{arm}.vllm.log"
        if log.is_file():
            copied.append(Path(shutil.copyfile(log, target / f"{arm}.vllm.log")))
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m int8alibi.engines.vllm_study", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/synthetic-qwen3-1.7b.yaml"))
    parser.add_argument("--results", default="results/synthetic-qwen3-1.7b-vllm")
    parser.add_argument("--parallel", type=int, default=4, help="generate processes side by side on the GPU")
    parser.add_argument("--logs-to", type=Path, default=None, help="copy one vLLM log per arm here (test fixture)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        run_config = plan_run_config(args.config, args.results)
        results, logs = Path(args.results), Path("logs", Path(args.results).name)
        print(f"run config {run_config}", flush=True)
        try:
            run_study(run_config, results, logs, args.parallel)
        finally:
            if args.logs_to is not None:
                print("copied", [str(p) for p in copy_logs(results, args.logs_to)], flush=True)
        print(json.dumps(report(results), indent=1, sort_keys=True), flush=True)
    except Int8AlibiError as exc:
        print(f"int8alibi.engines.vllm_study: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
