"""The stage runner: a stage's command line, its checked inputs and its run as a transaction.

Every stage module (``int8alibi.stages.<name>``) ends with ``raise SystemExit(stage_main(run))``.
The runner is not a stage, so a stage's code digest does not depend on another stage's code.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Mapping

from .. import portable
from ..config import Config, ReadScope, load_config
from ..errors import ConfigScopeError, InputError, Int8AlibiError, fault_line
from ..printable import printable
from ..progress import heartbeat, plain_stderr
from ..files.atomic import disk_space, sweep_stale
from ..provenance.chain import verify_input
from ..provenance.manifest import RUN_CONFIG, bind_protocol
from ..files.transaction import stage_transaction
from ..planning.stage_needs import READS_LINE, STAGES, UNDIGESTED_KEYS, StageNeeds
from .. import stage_spec
from .device_memory import cap_to_budget, log_peak_device_memory
from .gpu_slots import Slot, place

log = logging.getLogger("int8alibi")


def _module_name(run: Callable[..., None]) -> str:
    """The stage's importable module name, also when it runs as ``python -m`` (``__main__``)."""
    if run.__module__ != "__main__":
        return run.__module__
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    """``NAME=VALUE`` arguments as a mapping; a malformed or repeated one is an ``InputError``."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise InputError(f"{flag} {item!r}: expected NAME=VALUE")
        if name in pairs:
            raise InputError(f"{flag} {name}: given twice")
        pairs[name] = value
    return pairs


def _check_arguments(run: Callable[..., None], stage: str, given: Mapping[str, object]) -> None:
    """Every ``--input``/``--param`` name is one the stage reads, and every one it requires is given."""
    taken = {name: p for name, p in list(inspect.signature(run).parameters.items())[2:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(given) - set(taken))
    if unknown:
        raise InputError(f"--input/--param {', '.join(unknown)}: not read by stage {stage} "
                         f"(it reads: {', '.join(taken) or 'none'})")
    missing = [name for name, p in taken.items() if p.default is p.empty and name not in given]
    if missing:
        raise InputError(f"stage {stage} needs --input or --param {', '.join(missing)}")


def read_scope(stage: str) -> ReadScope:
    """The config keys ``stage`` may read: those its rule digests (``int8alibi.planning.stage_needs``)."""
    return ReadScope(stage, STAGES[stage].config, UNDIGESTED_KEYS)


def log_reads(scope: ReadScope) -> None:
    """The config keys the stage read, in its log (not an output); a read the scope refused, as an error."""
    log.info(READS_LINE, scope.stage, ", ".join(sorted(scope.read)) or "none", ", ".join(scope.unread) or "none")
    if scope.undeclared:
        raise ConfigScopeError(f"stage {scope.stage} read config keys its rule does not digest: "
                               f"{', '.join(sorted(scope.undeclared))} (add them to its entry in int8alibi.stage_spec.STAGES)")


def out_folder(out: Path) -> None:
    """Create ``--out`` if needed; one that is not a writable folder is an ``InputError`` naming it."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"--out {out}: not a folder (a {'symbolic link' if out.is_symlink() else 'file'} is there)")
    try:
        with disk_space(out):
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot be created ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: not writable by this user")


def guarded(stage: str, out: Path, inputs: list[Path], body: Callable[[], None]) -> int:
    """Run ``body`` writing into ``out`` as a transaction (``files.transaction``); 0, or 1 after one
    line on stderr naming what failed. Inputs lying in ``out`` (determinism's runs) are left alone."""
    try:
        out_folder(out)
        with disk_space(out), stage_transaction(out, inputs):
            for line in sweep_stale(out):  # temporaries of an earlier, killed run of this stage
                log.warning("%s: %s", stage, line)
            body()
    except Int8AlibiError as exc:
        print(printable(f"int8alibi: stage {stage} failed: {exc}"), file=sys.stderr)
        return 1
    except SystemExit as exc:  # code (a user arm) that tried to end the process: the stage did not finish
        print(printable(f"int8alibi: stage {stage} failed: something it ran called SystemExit({exc.code!r}); "
                        f"nothing was written"), file=sys.stderr)
        return 1
    except (OSError, MemoryError, RuntimeError) as exc:  # the machine's refusal (a file, memory): one line;
        fault = fault_line(exc, f"the stage writes into {out}")  # a bug keeps its traceback
        if fault is None:
            raise
        print(printable(f"int8alibi: stage {stage} failed: {fault}"), file=sys.stderr)
        return 1
    return 0


def _device_budget(stage: str, cfg: Config) -> int | None:
    """The device-memory budget a GPU stage of a CUDA run holds its process to (bytes), else None: read by
    the runner from the whole run config, not by the stage (the budget changes no byte)."""
    spec = stage_spec.BY_NAME.get(stage)
    if spec is None or not spec.gpu or cfg.get("resolved") is None or cfg.resolved_device != "cuda":
        return None
    return cfg.gpu_budget_bytes


def stage_main(run: Callable[..., None], argv: list[str] | None = None) -> int:
    """Parse ``--config``, ``--set k=v`` (repeatable), ``--out`` and ``--input name=path``; run the stage.

    Every ``--input`` lying in another stage's folder is first checked against that stage's
    manifest (``provenance.chain.verify_input``). A failure prints one line naming what failed and
    exits 1 (a full disk: ``DiskFullError``), and leaves ``--out`` exactly as it was: the stage runs
    as a transaction on that folder (``files.transaction``: snapshot, locked, restored on any
    failure, and by a watcher process when the stage is killed), and temporaries a killed earlier run
    left in ``--out`` are removed or reported (``files.atomic.sweep_stale``). The protocol's files
    are bound when the stage starts (``provenance.manifest.bind_protocol``): a manifest written after
    they changed is refused, so results are never recorded under a protocol they were not computed
    under. A GPU job of a CUDA run is pinned to one of the run's devices before CUDA starts
    (``runtime.gpu_slots``: ``--gpu-mem-mb`` is what it asked Snakemake for), holding its claim until
    it ends. Every stage computes under the portable CPU settings
    (``int8alibi.portable``): started without them, it re-executes itself with them; if they still do
    not hold, it stops before computing anything.
    """
    module = _module_name(run)
    stage = module.rsplit(".", 1)[-1]
    pinned = STAGES.get(stage, StageNeeds()).pinned
    scope = read_scope(stage) if stage in STAGES else None  # None: no stage of the table (a test's function)
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == module:  # this process was started as the stage
        portable.ensure_process(module, sys.argv[1:])
    doc = (sys.modules[run.__module__].__doc__ or "").strip()
    names = [f"{n}{'' if p.default is p.empty else ' (optional)'}"
             for n, p in list(inspect.signature(run).parameters.items())[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                           p.KEYWORD_ONLY)]
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0] if doc else None,
                                     epilog=f"--input/--param names this stage reads: {', '.join(names) or 'none'}. "
                                            "Snakemake runs it with the arguments its rule prints (snakemake -n -p).")
    parser.add_argument("--config", required=True, type=Path,
                        help="the run config (<results>/.run/<digest>/config.yaml, written when Snakemake plans a run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (YAML value; repeatable)")
    parser.add_argument("--out", required=True, type=Path, help="the stage's folder (<results>/<stage>)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                        help="an upstream table or folder the stage reads, checked against its stage's manifest "
                             "(repeatable)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a named parameter of the stage (repeatable)")
    parser.add_argument("--gpu-mem-mb", type=int, default=None, metavar="MIB",
                        help="the device memory this job asked Snakemake for (a GPU stage's rule gives it): on a "
                             "CUDA run with several devices the job claims one with that much left "
                             "(int8alibi.runtime.gpu_slots)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        inputs = {name: Path(value) for name, value in _pairs(args.input, "--input").items()}
        params = _pairs(args.param, "--param")
        both = sorted(set(inputs) & set(params))
        if both:
            raise InputError(f"--input/--param {', '.join(both)}: given as both")
        _check_arguments(run, stage, {**inputs, **params})
        portable.configure_torch(pinned=pinned)
        portable.check_process(pinned=pinned)
        cfg: Config = load_config(args.config, args.set)
        budget = _device_budget(stage, cfg)
        for path in inputs.values():  # another stage's files are read only as its manifest records them
            verify_input(path, own_dir=args.out)
        # before anything initialises CUDA: CUDA_VISIBLE_DEVICES counts only then
        slot: Slot | None = place(cfg.data, args.config, args.gpu_mem_mb, stage=stage)
        if scope is not None:  # the stage reads only the keys its rule digests
            cfg = cfg.scoped(scope)
    except Int8AlibiError as exc:
        print(printable(f"int8alibi: stage {stage} failed: {exc}"), file=sys.stderr)
        return 1

    def body() -> None:
        log.info("%s: run config %s", stage, args.config)
        token = RUN_CONFIG.set(args.config)  # recorded as an input of the stage's manifest
        try:
            # a line every ten seconds on the console (Snakemake shows it) and in the log, which holds plain
            # lines; the protocol is bound as found now: an amendment made while the stage runs refuses its manifest
            with heartbeat(stage), plain_stderr(), bind_protocol(Path.cwd()):
                cap_to_budget(budget, log)
                run(cfg, args.out, **inputs, **params)
            if scope is not None:
                log_reads(scope)
        finally:
            RUN_CONFIG.reset(token)
            log_peak_device_memory(log)  # the log, not an output: it differs from run to run

    try:
        return guarded(stage, args.out, list(inputs.values()), body)
    finally:
        if slot is not None:
            slot.release()
