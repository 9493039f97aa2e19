"""The machine a run is planned on: its CPU cores and each CUDA device's name, total and free memory.

Planning reads this once (``planning.resolve``: ``gpu_budget_mb: auto`` is device 0's free memory
then) and ``int8alibi hardware`` prints it with the plan settings that follow. ``INT8ALIBI_HARDWARE``
describes another machine instead, as JSON (``{"cores": 16, "devices": [{"name": "NVIDIA GeForce RTX
4090", "total_mb": 24564, "free_mb": 23800}]}``): to plan for a card from a host without it, and in
tests. torch is imported only to look at CUDA devices, never at import time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InputError

ENV = "INT8ALIBI_HARDWARE"
MIB = 1 << 20


@dataclass(frozen=True)
class Device:
    """One CUDA device: its name, total and free memory (MiB) when looked at."""

    name: str
    total_mb: int
    free_mb: int


@dataclass(frozen=True)
class Hardware:
    """CPU cores and CUDA devices of one machine, and where the description came from."""

    cores: int
    devices: tuple[Device, ...]
    source: str


def _cuda_devices() -> tuple[Device, ...]:
    try:
        import torch
    except ImportError:  # the planning environment (workflow/envs/plan.txt) has no torch: it sees no device
        return ()
    if not torch.cuda.is_available():
        return ()
    found = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        found.append(Device(torch.cuda.get_device_name(i), total // MIB, free // MIB))
    return tuple(found)


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{ENV}: {what} must be a positive integer, got {value!r}")
    return value


def parse(text: str) -> Hardware:
    """The machine ``INT8ALIBI_HARDWARE`` describes (see the module doc); one-line error otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{ENV}: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, Mapping) or set(data) - {"cores", "devices"}:
        raise InputError(f"{ENV}: expected an object with keys cores and devices, got {text[:80]!r}")
    devices = []
    for i, d in enumerate(data.get("devices", [])):
        if not isinstance(d, Mapping) or set(d) != {"name", "total_mb", "free_mb"} or not isinstance(d["name"], str):
            raise InputError(f"{ENV}: device {i} must have exactly name (text), total_mb and free_mb")
        total, free = _positive_int(d["total_mb"], f"device {i} total_mb"), _positive_int(d["free_mb"], f"device {i} free_mb")
        if free > total:
            raise InputError(f"{ENV}: device {i} has free_mb {free} above its total_mb {total}")
        devices.append(Device(d["name"], total, free))
    return Hardware(_positive_int(data.get("cores", 1), "cores"), tuple(devices), f"described by {ENV}")


def detect(env: Mapping[str, str] | None = None) -> Hardware:
    """This machine (the cores this process may use, torch's CUDA devices), or the one ``INT8ALIBI_HARDWARE`` describes."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return parse(env[ENV])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Hardware(cores, _cuda_devices(), "detected on this host")
