"""Which of the run's GPUs a GPU job runs on: one device per job, claimed before CUDA starts.

Snakemake schedules GPU jobs against the sum of their ``gpu_mem_mb`` (the run's budget times its
devices: ``planning.resources.device_limit``), but it does not say which device a job gets. So each
GPU job of a CUDA run with several devices (the ``resolved`` block's ``gpus``) claims one here and
sets ``CUDA_VISIBLE_DEVICES`` to it before torch initialises CUDA (torch reads the variable then);
a process that already initialised CUDA is refused, since the variable would no longer count.

A claim is a file under ``<results>/.run/gpus/<host>/`` holding the device and the job's MiB, with
an exclusive ``flock`` on it for the claimant's life: a job killed in any way releases it through
the kernel, and a claim file whose lock can be taken is stale and removed. Picking and claiming
happen under one lock file in the same folder. The job takes the device with the most budget left
(the budget less the MiB claimed on it) that fits its need, the lowest index on a tie; when none
fits it waits, saying every 30 s what for. Each job asks for at most the budget (the plan refuses
more), so it fits an empty device, and a waiting job holds no claim: it waits only for running
jobs to end. Snakemake's sum can admit jobs that do not pack onto the devices (two of 60% on one
card each of two, then a third): the third waits for a device instead of overfilling one.

A job that starts with ``CUDA_VISIBLE_DEVICES`` set to other than the run's devices had it assigned
(SLURM's ``--gpus``): it keeps it. With one device there is nothing to choose: the job is pinned to
it and claims nothing (Snakemake's limit is that device's budget). The manifest records the variable
(``provenance.environment``), so each stage's device lands in its manifest.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..planning.resolve import VISIBLE, host

log = logging.getLogger("int8alibi")

FOLDER = "gpus"  # beside the run configs: <results>/.run/gpus/<host>/
LOCK = ".lock"
SUFFIX = ".claim"
POLL_S = 1.0
WAIT_LOG_S = 30.0


@dataclass
class Slot:
    """A held claim: ``device`` for ``mb`` MiB, locked through ``fd`` until ``release``."""

    device: str
    mb: int
    path: Path
    fd: int | None

    def release(self) -> None:
        """Give the device back (removing the claim file first, so no one reads it as stale)."""
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


def claims_folder(run_config: Path, machine: str | None = None) -> Path:
    """Where the claims on this host's devices lie, for the run config ``<results>/.run/<digest>/config.yaml``."""
    return Path(run_config).resolve().parent.parent / FOLDER / (machine or host())


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claimed_mb(folder: Path) -> dict[str, int]:
    """MiB claimed on each device by live claims in ``folder``; stale claims (no holder) are removed.
    Call it holding the folder's lock."""
    taken: dict[str, int] = {}
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # released since it was listed
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: a live claim
                text = os.read(fd, 4096).decode("utf-8", "replace")
                try:
                    claim = json.loads(text)
                    device, mb = str(claim["device"]), int(claim["mb"])
                except (ValueError, KeyError, TypeError):
                    raise InputError(f"{path}: a live GPU claim that is not a claim ({text[:80]!r}); the process "
                                     f"holding it is {path.name.split('-')[0]}") from None
                taken[device] = taken.get(device, 0) + mb
            else:
                path.unlink(missing_ok=True)  # its holder is gone
        finally:
            os.close(fd)
    return taken


def pick(devices: Sequence[str], budget_mb: int | None, need_mb: int, taken: Mapping[str, int]) -> str | None:
    """The device with the most budget left that fits ``need_mb`` (the lowest index on a tie), or
    None: none fits now. Without a budget every device fits and the least claimed one is taken."""
    best, best_left = None, None
    for device in devices:
        left = (sys.maxsize if budget_mb is None else budget_mb) - taken.get(device, 0)
        if left >= need_mb and (best_left is None or left > best_left):
            best, best_left = device, left
    return best


def _hold(folder: Path, device: str, need_mb: int, stage: str) -> Slot:
    path = folder / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and made under the folder's lock: no one else has it
    os.write(fd, json.dumps({"device": device, "mb": need_mb, "pid": os.getpid(), "stage": stage}).encode())
    return Slot(device, need_mb, path, fd)


def claim(folder: Path, devices: Sequence[str], budget_mb: int | None, need_mb: int, *, stage: str = "",
          timeout_s: float | None = None, poll_s: float = POLL_S, log_every_s: float = WAIT_LOG_S) -> Slot:
    """Claim one of ``devices`` for ``need_mb`` MiB (see the module doc), waiting until one fits;
    ``timeout_s`` (tests) stops the wait with ``InputError``. ``need_mb`` above the budget never fits:
    refused at once."""
    if budget_mb is not None and need_mb > budget_mb:
        raise InputError(f"gpu: a job of {need_mb} MiB cannot fit one device of the run's budget {budget_mb} MiB")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        said = start
        while True:
            with _locked(folder / LOCK):
                taken = claimed_mb(folder)
                device = pick(devices, budget_mb, need_mb, taken)
                if device is not None:
                    return _hold(folder, device, need_mb, stage)
            now = time.monotonic()
            if timeout_s is not None and now - start >= timeout_s:
                raise InputError(f"gpu: no device of {list(devices)} had {need_mb} MiB left of the budget "
                                 f"{budget_mb} MiB within {timeout_s} s (claims in {folder})")
            if now - said >= log_every_s:
                left = ", ".join(f"{d}: {(budget_mb or 0) - taken.get(d, 0)} MiB" for d in devices)
                log.info("gpu: waiting %.0f s for %d MiB on one of devices %s (left of the budget: %s)",
                         now - start, need_mb, ", ".join(devices), left)
                said = now
            time.sleep(poll_s)
    except OSError as exc:
        raise InputError(f"gpu: the claims in {folder} cannot be read or written ({exc.strerror or exc})") from None


def _refuse_if_cuda_started() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise InputError(f"gpu: CUDA was initialised before the job was pinned to a device, so {VISIBLE} would not "
                         "count; nothing may touch torch.cuda before the stage runner places the job")


def place(run_config: Mapping[str, Any], run_config_path: Path, need_mb: int | None, *, stage: str = "",
          env: MutableMapping[str, str] | None = None, timeout_s: float | None = None,
          poll_s: float = POLL_S) -> Slot | None:
    """Pin this GPU job to one of the run's devices, setting ``CUDA_VISIBLE_DEVICES`` in ``env`` (this
    process's environment by default); the held claim, or None where nothing is claimed: a CPU run,
    no device resolved, a job that is not a GPU job (``need_mb`` None), one device, or a device the
    environment assigned. Call it before CUDA is initialised."""
    env = os.environ if env is None else env
    resolved = run_config.get("resolved") or {}
    devices = [str(d) for d in (resolved.get("gpus") or {}).get("devices") or []]
    if need_mb is None or resolved.get("device") != "cuda":
        return None
    if not devices:
        log.info("gpu: the run resolved no devices (%s); %s is %s", (resolved.get("gpus") or {}).get("reason", "planned "
                 "before devices were resolved"), VISIBLE, env.get(VISIBLE, "unset"))
        return None
    _refuse_if_cuda_started()
    given = env.get(VISIBLE)
    if given is not None and given != ",".join(devices):
        log.info("gpu: %s=%s was assigned by the environment (a scheduler), not the run's devices %s: kept",
                 VISIBLE, given, ",".join(devices))
        return None
    budget = (resolved.get("gpu_budget") or {}).get("mb")
    if len(devices) == 1:
        env[VISIBLE] = devices[0]
        log.info("gpu: device %s (the run's one device; %d MiB asked, of a budget of %s MiB)", devices[0], need_mb, budget)
        return None
    slot = claim(claims_folder(run_config_path), devices, budget, need_mb, stage=stage, timeout_s=timeout_s,
                 poll_s=poll_s)
    env[VISIBLE] = slot.device
    log.info("gpu: device %s (%d MiB claimed, of a budget of %s MiB per device; devices %s)", slot.device, need_mb,
             budget, ",".join(devices))
    return slot
