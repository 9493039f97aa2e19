"""Resolve once: what ``device: auto`` and ``arms: auto`` stand for is decided when a run is planned.

``plan`` runs while Snakemake parses the Snakefile (``workflow/rules/common.smk``): it resolves the
config's device and arm pair on the planning host, with the reason, into the ``resolved`` block of
the run config (``<results>/.run/<digest>/config.yaml``), or reuses the block an earlier plan wrote for
the same ``device`` and ``arms`` values (``config.earlier_plan``). A cluster job re-parsing the Snakefile on a compute node
therefore reads the resolution; it does not make its own. To resolve again (e.g. after moving a
finished CPU run to a GPU host) delete ``<results>/.run/`` or name device and arms explicitly.

Stages read the block through ``Config.resolved_device`` / ``Config.resolved_arms`` and build what
it names with ``stage_device`` / ``stage_arms``. When the resolved device or arm cannot run where the
stage executes, they raise ``InputError`` naming the arm and the host: nothing is resolved again and
nothing is substituted.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..arm_names import VLLM_PAIR, check_names
from ..config import RESOLVED, Config
from ..errors import InputError
from ..hardware import Hardware, detect

if TYPE_CHECKING:  # torch is imported where a device is decided: planning a named device and arms needs none
    import torch


def host() -> str:
    """The name of the machine this process runs on, as manifests and errors name it."""
    return socket.gethostname()


def _spec(config: Mapping[str, Any]) -> dict[str, Any]:
    arms = config["arms"]
    spec = {"device": config.get("device", "auto"), "arms": arms if isinstance(arms, str) else list(arms)}
    if "engine" in config:  # a config that does not name it means auto, and plans as before engines existed
        spec["engine"] = config["engine"]
    return spec


def vllm_importable() -> bool:
    """Whether this interpreter can import vLLM (looked up, not imported: planning stays fast)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(spec: str, arms: Sequence[str], importable: bool) -> tuple[str, str]:
    """``(engine, reason)`` for the config's ``engine`` value and the run's resolved arm pair.

    vLLM's engine serves only the vLLM pair (its kernel is chosen inside vLLM) and needs vLLM where
    the run is planned and run; ``engine: vllm`` without either is refused, never replaced by own.
    """
    pair = sorted(arms) == sorted(VLLM_PAIR)
    if spec == "own":
        return "own", "explicit: the config says engine: own"
    if spec == "vllm":
        if not pair:
            raise InputError(f"engine: vllm runs only the vLLM arm pair {list(VLLM_PAIR)}, but the run's arms are "
                             f"{list(arms)}; name those arms, or engine: own / auto")
        if not importable:
            raise InputError(f"engine: vllm, but vLLM cannot be imported on host {host()} where the run is planned; "
                             "install it (dev/device-vllm carries it to a GPU host), or say engine: own / auto")
        return "vllm", "explicit: the config says engine: vllm (the vLLM pair, vLLM importable)"
    if spec != "auto":
        raise InputError(f"engine: {spec!r}: expected auto, own or vllm")
    if not pair:
        return "own", f"auto: the arms {list(arms)} are not the vLLM pair"
    if not importable:
        return "own", f"auto: the vLLM pair, but vLLM cannot be imported on host {host()}"
    return "vllm", f"auto: the vLLM pair, and vLLM can be imported on host {host()}"


def _torch_for_auto() -> Any:
    """torch, which ``auto`` needs to see the devices and arms of this host; a clear error without it."""
    try:
        import torch
    except ImportError:
        raise InputError("device: auto / arms: auto are resolved with torch, which this environment does not have "
                         "(planning with Snakemake and the parse-time packages of workflow/envs/plan.txt only): run "
                         "Snakemake from the project's environment (.venv, made by ./bootstrap), or name device "
                         "and arms in the config (e.g. device: cpu, arms: [exact-cutlass-order, "
                         "exact-triton-order])") from None
    return torch


def resolve(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``resolved`` block for ``config``'s device and arms, decided on this host.

    ``device: auto`` is CUDA when torch sees a CUDA device here, else CPU; ``arms: auto`` is the first
    pair of ``kernels.registry.AUTO_ORDER`` available on that device (``registry.select``). Explicit
    values are recorded as they are: whether they can run is checked where each stage executes.
    """
    here, spec = host(), _spec(config)
    if "auto" in (spec["device"], spec["arms"]):
        torch = _torch_for_auto()
    if spec["device"] == "auto":
        if torch.cuda.is_available():
            device, why_device = "cuda", f"auto: a CUDA device is visible to torch on host {here}"
        else:
            device, why_device = "cpu", f"auto: no CUDA device visible to torch on host {here}"
    else:
        device, why_device = spec["device"], f"explicit: the config says device: {spec['device']}"
    unavailable: dict[str, str] = {}
    if spec["arms"] == "auto":
        from ..kernels.registry import select

        try:
            arm_a, arm_b, evidence = select("auto", device)
        except InputError as exc:
            raise InputError(f"arms: auto cannot be resolved on host {here} ({why_device}): {exc}") from None
        arms = [arm_a.name, arm_b.name]
        passed_over = evidence.get("unavailable", {})
        unavailable = {str(k): str(v) for k, v in passed_over.items()} if isinstance(passed_over, Mapping) else {}
        why_arms = f"{evidence['why']}, on host {here}: {arms}"
        if unavailable:
            why_arms += f"; passed over (reasons under unavailable): {', '.join(unavailable)}"
    else:
        arms = [str(a) for a in spec["arms"]]
        check_names(arms)
        why_arms = f"explicit: the config names {arms}"
    engine, why_engine = resolve_engine(str(config.get("engine", "auto")), arms, vllm_importable())
    return {"spec": spec, "device": device, "arms": arms, "engine": engine,
            "reason": {"device": why_device, "arms": why_arms, "engine": why_engine},
            "host": here, "unavailable": unavailable}


VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_names(count: int, env: Mapping[str, str] | None = None) -> list[str]:
    """The names under which a job would see this process's ``count`` CUDA devices in
    ``CUDA_VISIBLE_DEVICES``: the planning process's own entries when it has that variable (they name
    the devices of the machine, not of this process), else ``0`` .. ``count-1``."""
    env = os.environ if env is None else env
    given = env.get(VISIBLE)
    if given is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in given.split(",") if name.strip()][:count]


def resolve_gpus(spec: Any, device: str, hardware: Hardware | None = None,
                 env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``gpus`` entry of the resolved block: the devices a CUDA run's GPU jobs are pinned to, one
    each (``runtime.gpu_slots``), named as ``CUDA_VISIBLE_DEVICES`` names them.

    ``auto`` is every CUDA device the planning host shows (``hardware.detect``) of the same model as
    the first: a GPU's bytes are its own, and the determinism stage compares runs that must differ
    only by what the protocol varies, so cards of another model are left out (the reason names them).
    A list is taken as given (whether each device exists is for the job's CUDA to say). A CPU run has
    none; a CUDA run planned where no GPU is visible (a cluster's login node) has none: its scheduler
    assigns them.
    """
    if device != "cuda":
        return {"spec": spec, "devices": [], "reason": "not applicable: device cpu"}
    if spec != "auto":
        named = [str(d) for d in spec]
        if len(set(named)) != len(named):
            raise InputError(f"gpus: {list(spec)} names a device twice")
        return {"spec": list(spec), "devices": named, "reason": f"explicit: the config says gpus: {named}"}
    env = os.environ if env is None else env
    machine = detect(env) if hardware is None else hardware
    if not machine.devices:
        return {"spec": spec, "devices": [],
                "reason": f"auto: no CUDA device visible on host {host()} where the run was planned ({machine.source}): "
                          "the scheduler assigns each job its device (CUDA_VISIBLE_DEVICES)"}
    names = visible_names(len(machine.devices), env)
    if len(names) != len(machine.devices):
        raise InputError(f"gpus: auto: {VISIBLE}={env.get(VISIBLE)!r} names {len(names)} devices, but "
                         f"{len(machine.devices)} are visible on host {host()} ({machine.source}); name gpus in the config")
    model = machine.devices[0].name
    chosen = [name for name, d in zip(names, machine.devices) if d.name == model]
    other = [f"{name} ({d.name})" for name, d in zip(names, machine.devices) if d.name != model]
    where = f"named as {VISIBLE} names them here" if VISIBLE in env else f"{VISIBLE} not set here"
    left_out = f"; left out, another model than {model}: {', '.join(other)}" if other else ""
    return {"spec": spec, "devices": chosen,
            "reason": f"auto: the {len(chosen)} {model} device(s) visible on host {host()} when the run was planned "
                      f"({machine.source}; {where}){left_out}"}


def resolve_budget(spec: Any, device: str, hardware: Hardware | None = None, gpus: Sequence[str] | None = None,
                   env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``gpu_budget`` entry of the resolved block: the device memory (MiB) each GPU job works within,
    on the one device it is pinned to.

    ``auto`` on a CUDA run is the smallest free memory among the run's devices ``gpus`` (as
    ``resolve_gpus`` names them; None: CUDA device 0) on the planning host (``hardware.detect``), so a
    job fits whichever device it gets; on a CPU run device memory is not applicable (no budget),
    unless the config names one: then the stages bound the same chunked structures in host memory,
    which is how the budgeted code path runs (and is tested) without a GPU. A CUDA run planned where
    no GPU is visible (a cluster's login node) has no budget unless the config names one.
    """
    if spec != "auto":
        where = "" if device == "cuda" else " (device cpu: it bounds the same chunked structures in host memory)"
        return {"spec": spec, "mb": int(spec), "reason": f"explicit: the config says gpu_budget_mb: {spec}{where}"}
    if device != "cuda":
        return {"spec": spec, "mb": None, "reason": "not applicable: device cpu (the budget bounds CUDA device memory)"}
    env = os.environ if env is None else env
    machine = detect(env) if hardware is None else hardware
    if not machine.devices:
        return {"spec": spec, "mb": None,
                "reason": f"auto: no CUDA device visible on host {host()} where the run was planned ({machine.source}), so "
                          "no budget: each GPU job asks for what it holds; name gpu_budget_mb to set one"}
    names = visible_names(len(machine.devices), env)
    wanted = list(gpus) if gpus else names[:1]
    unseen = [name for name in wanted if name not in names]
    if unseen:
        raise InputError(f"gpu_budget_mb: auto: device(s) {unseen} of gpus are not visible on host {host()} where the run "
                         f"is planned (visible: {names}, {machine.source}); name gpu_budget_mb, or gpus among those")
    seen = [(name, machine.devices[names.index(name)]) for name in wanted]
    name, least = min(seen, key=lambda pair: pair[1].free_mb)
    if len(seen) == 1:
        what = f"the free memory of CUDA device {name} ({least.name}, {least.total_mb} MiB)"
    else:
        what = (f"the smallest free memory among the run's {len(seen)} CUDA devices {wanted}: device {name}'s "
                f"({least.name}, {least.total_mb} MiB), so a job fits whichever it is pinned to")
    return {"spec": spec, "mb": least.free_mb,
            "reason": f"auto: {what} on host {host()} when the run was planned ({machine.source})"}


def plan(config: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run config: ``config`` plus its ``resolved`` block.

    The block of ``previous`` (the run config an earlier plan wrote) is reused when it was made for
    the same device and arms values; otherwise the run is resolved here. Its devices (``resolve_gpus``)
    are reused when made for the same ``gpus`` value, and its device-memory budget (``resolve_budget``)
    when made for the same ``gpu_budget_mb`` value and devices, else decided here. A run config
    written before budgets or devices were resolved is kept as written when it is ``previous`` itself.
    """
    if RESOLVED in config:
        raise InputError("the config has a 'resolved' block: that block is written by the pipeline into "
                         "<results>/.run/<digest>/config.yaml when it plans a run; remove it from your config")
    earlier = (previous or {}).get(RESOLVED)
    if isinstance(earlier, Mapping) and earlier.get("spec") == _spec(config):
        block = dict(earlier)
        if "engine" not in block:  # planned before engines were resolved: the engine is decided now, once
            engine, why = resolve_engine(str(config.get("engine", "auto")), block["arms"], vllm_importable())
            block.update(engine=engine, reason={**block["reason"], "engine": why})
    else:
        block = resolve(config)
    own = previous is not None and {k: v for k, v in previous.items() if k != RESOLVED} == dict(config)
    if own and ("gpu_budget" not in block or "gpus" not in block):  # its own run config: kept as written
        return {**config, RESOLVED: block}
    spec, gpus_spec = config.get("gpu_budget_mb", "auto"), config.get("gpus", "auto")
    new_gpus = (block.get("gpus") or {}).get("spec") != gpus_spec
    if new_gpus:
        block = {**block, "gpus": resolve_gpus(gpus_spec, block["device"])}
    if new_gpus or (block.get("gpu_budget") or {}).get("spec") != spec:  # auto follows the devices
        block = {**block, "gpu_budget": resolve_budget(spec, block["device"], gpus=block["gpus"]["devices"])}
    return {**config, RESOLVED: block}


def _origin(cfg: Config) -> str:
    origin = cfg.device_origin
    if origin is None:
        return "named by the config"
    return f"resolved on host {origin[0]}: {origin[1]}"


def stage_device(cfg: Config, arms: Sequence[str] = ()) -> torch.device:
    """The run's resolved device, after checking that it exists on this host (else ``InputError``)."""
    import torch

    name = cfg.resolved_device
    if name == "cuda" and not torch.cuda.is_available():
        what = f"arm{'s' if len(arms) > 1 else ''} {', '.join(arms)} on device cuda" if arms else "device cuda"
        raise InputError(f"{what} ({_origin(cfg)}) cannot run on host {host()}: no CUDA device is visible to torch "
                         "here; nothing is substituted: run this job where a GPU is visible, or plan the run again "
                         "(delete <results>/.run/ or name device and arms in the config)")
    return torch.device(name)


def stage_arms(cfg: Config) -> tuple[torch.device, Any, Any, dict[str, Any]]:
    """``(device, arm A, arm B, selection evidence)`` for the run's resolved arms on this host.

    Fails closed with ``InputError`` naming the arm and the host when an arm is not available here.
    The evidence has ``registry.select``'s keys, with ``why`` the resolution's reason.
    """
    from ..kernels.registry import get

    names = cfg.resolved_arms
    device = stage_device(cfg, names)
    arms = []
    for name in names:
        try:
            arm = get(name, device, user_time_limit_s=cfg.get("user_arm_time_limit_s"))
        except InputError as exc:
            raise InputError(f"arm {name} cannot be built on host {host()}: {exc}") from None
        ok, why = arm.available()
        if not ok:
            block = cfg.resolution
            origin = (f"resolved on host {block['host']}: {block['reason']['arms']}" if block is not None
                      else "named by the config")
            raise InputError(f"arm {name} on {device} ({origin}) cannot run on host {host()}: {why}; nothing is "
                             "substituted")
        arms.append(arm)
    arm_a, arm_b = arms
    block = cfg.resolution
    evidence: dict[str, Any] = {
        "spec": cfg["arms"] if isinstance(cfg["arms"], str) else list(cfg["arms"]),
        "device": str(device),
        "chosen": list(names),
        "why": block["reason"]["arms"] if block is not None else f"explicit pair {list(names)} named by the config",
        "unavailable": dict(block.get("unavailable", {})) if block is not None else {},
        "emulation": bool(arm_a.is_emulation or arm_b.is_emulation),
        "arms": [arm_a.evidence(), arm_b.evidence()],
        "resolved": dict(block) if block is not None else "not resolved: the config names device and arms",
        "host": host(),
    }
    return device, arm_a, arm_b, evidence


def require_arm(cfg: Config, name: str, device: torch.device) -> Any:
    """Arm ``name`` on ``device``, available on this host, else ``InputError`` naming the arm and the host."""
    from ..kernels.registry import get

    arm = get(name, device, user_time_limit_s=cfg.get("user_arm_time_limit_s"))
    ok, why = arm.available()
    if not ok:
        raise InputError(f"arm {name} on {device} ({_origin(cfg)}) cannot run on host {host()}: {why}; "
                         "nothing is substituted")
    return arm
