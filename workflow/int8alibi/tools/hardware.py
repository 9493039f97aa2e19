"""``int8alibi hardware``: this machine's cores and CUDA devices, and the settings a GPU plan here takes.

``profiles/gpu`` takes the cores from the machine (``cores: all``), the devices its GPU jobs spread
over (``gpus``, default every visible one of device 0's model) and the device memory from the run's
budget (``gpu_budget_mb``, default the least free memory among those devices when the run is
planned); this command shows what those come to here, the lines to pin them by hand, and, with
``--configfile``, each GPU job's device-memory request for that config under the budget, or the
plan's refusal naming the stage that cannot fit. ``INT8ALIBI_HARDWARE`` (``int8alibi.hardware``)
describes another machine instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import RESOLVED, load_config
from ..hardware import Hardware, detect
from ..planning.resolve import resolve_budget, resolve_gpus
from ..planning.resources import GPU_RULES, plan_resources


def report(machine: Hardware) -> list[str]:
    """The lines describing ``machine`` and the plan settings that follow from it."""
    lines = [f"host: {machine.source}", f"cpu cores: {machine.cores}"]
    if not machine.devices:
        lines.append("cuda devices: none visible (a CUDA run planned here has no budget unless the config names "
                     "gpu_budget_mb)")
    for i, d in enumerate(machine.devices):
        lines.append(f"cuda device {i}: {d.name}, {d.total_mb} MiB total, {d.free_mb} MiB free")
    lines.append(f"plan settings: --cores {machine.cores}  (profiles/gpu says cores: all)")
    if machine.devices:
        devices = resolve_gpus("auto", "cuda", machine)["devices"]
        free = resolve_budget("auto", "cuda", machine, gpus=devices)["mb"]
        least = "device 0's free memory" if len(devices) == 1 else f"the least free memory of those {len(devices)}"
        lines.append(f"  gpus: auto = {', '.join(devices)} (every visible device of device 0's model, each GPU job "
                     f"pinned to one; or name them: --config 'gpus=[{','.join(devices)}]')")
        lines.append(f"  gpu_budget_mb: auto = {free} MiB ({least} now; or name it: --config gpu_budget_mb={free})")
        lines.append(f"  Snakemake's limit: --resources gpu_mem_mb={free * len(devices)}  (set from the budget times "
                     f"the {len(devices)} device(s) when not given)")
    return lines


def job_requests(configfile: Path, machine: Hardware, budget: str) -> list[str]:
    """Each GPU job's ``gpu_mem_mb`` for ``configfile`` planned on ``machine`` with ``device: cuda``
    (raises the plan's ``InputError`` when a stage cannot fit)."""
    from ..protocol import load

    cfg = load_config(configfile, ["device=cuda", f"gpu_budget_mb={budget}"])
    spec = cfg.data["gpu_budget_mb"]
    devices = resolve_gpus(cfg.data.get("gpus", "auto"), "cuda", machine)["devices"]
    run = {**cfg.data, RESOLVED: {"device": "cuda", "gpu_budget": resolve_budget(spec, "cuda", machine, gpus=devices)}}
    plan = plan_resources(run, load())
    return [f"{configfile}: {rule}: gpu_mem_mb={plan[rule].gpu_mem_mb}" for rule in GPU_RULES]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="int8alibi hardware", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, help="also plan this config's GPU jobs (device cuda) here")
    parser.add_argument("--gpu-budget-mb", default="auto", help="the budget to plan them with (default auto)")
    args = parser.parse_args(argv)
    machine = detect()
    for line in report(machine):
        print(line)
    if args.configfile is not None:
        budget = args.gpu_budget_mb if args.gpu_budget_mb == "auto" else str(int(args.gpu_budget_mb))
        for line in job_requests(args.configfile, machine, budget):
            print(line)
    return 0
