"""Stages: one module per pipeline stage, each a function from input paths to output paths.

Every stage module defines ``run(cfg, out_dir, **paths)`` and ends with
``if __name__ == "__main__": stage_main(run)``. Rules call ``python -m int8alibi.stages.<name>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable

from .. import portable
from ..config import Config, load_config
from ..provenance.atomic import disk_space, sweep_stale
from ..errors import Int8AlibiError
from ..provenance.chain import verify_input

log = logging.getLogger("int8alibi")

# Stages that run the model's float forward pass: one intra-op thread (see int8alibi.portable).
FORWARD_STAGES = frozenset({"capture", "generate", "perplexity", "tokens", "prefill_decode"})


def _module_name(run: Callable[..., None]) -> str:
    """The stage's importable module name, also when it runs as ``python -m`` (``__main__``)."""
    if run.__module__ != "__main__":
        return run.__module__
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def stage_main(run: Callable[..., None], argv: list[str] | None = None) -> int:
    """Parse ``--config``, ``--set k=v`` (repeatable), ``--out`` and ``--input name=path``; run the stage.

    Every ``--input`` lying in another stage's folder is first checked against that stage's
    manifest (``provenance.chain.verify_input``). A failure prints one line naming what failed and exits 1 (a full disk:
    ``DiskFullError``); the stage writes nothing partial because every writer goes through a
    temporary file and a rename, and temporaries a killed earlier run left in ``--out`` are removed
    or reported (``provenance.atomic.sweep_stale``). Every stage computes under
    the portable CPU settings (``int8alibi.portable``): started without them, it re-executes itself
    with them; if they still do not hold, it stops before computing anything.
    """
    module = _module_name(run)
    stage = module.rsplit(".", 1)[-1]
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == module:  # this process was started as the stage
        portable.ensure_process(module, sys.argv[1:])
    parser = argparse.ArgumentParser(prog=run.__module__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--input", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        portable.configure_torch(forward=stage in FORWARD_STAGES)
        portable.check_process(forward=stage in FORWARD_STAGES)
        cfg: Config = load_config(args.config, args.set)
        inputs = dict(item.split("=", 1) for item in args.input)
        params = dict(item.split("=", 1) for item in args.param)
        for path in inputs.values():  # another stage's files are read only as its manifest records them
            verify_input(Path(path), own_dir=args.out)
        with disk_space(args.out):
            args.out.mkdir(parents=True, exist_ok=True)
            log.info("%s: run config %s", stage, args.config)
            for line in sweep_stale(args.out):  # temporaries of an earlier, killed run of this stage
                log.warning("%s: %s", stage, line)
            run(cfg, args.out, **{k: Path(v) for k, v in inputs.items()}, **params)
    except Int8AlibiError as exc:
        print(f"int8alibi: stage {stage} failed: {exc}", file=sys.stderr)
        return 1
    return 0
