"""Which torch device a stage runs on: ``auto`` takes a CUDA GPU when one is present."""

from __future__ import annotations

import torch

from .errors import InputError


def resolve_device(spec: str = "auto") -> torch.device:
    """Map a config ``device`` value to a torch device; asking for cuda without one is an error."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cuda" and not torch.cuda.is_available():
        raise InputError("config device=cuda but no CUDA GPU is visible to torch")
    if spec not in ("cpu", "cuda"):
        raise InputError(f"unknown device {spec!r} (expected auto, cpu or cuda)")
    return torch.device(spec)


def describe(device: torch.device) -> dict[str, str]:
    """Device facts recorded in manifests and kernel evidence."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "device": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": str(torch.version.cuda),
            "driver": _driver_version(),
        }
    return {"device": "cpu", "compute_capability": "n/a", "cuda": "n/a", "driver": "n/a"}


def _driver_version() -> str:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:  # driver query is evidence, not a requirement
        return "unknown"
