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

from ..config import Config, load_config
from ..errors import Int8AlibiError

log = logging.getLogger("int8alibi")


def stage_main(run: Callable[..., None], argv: list[str] | None = None) -> int:
    """Parse ``--config``, ``--set k=v`` (repeatable), ``--out`` and ``--input name=path``; run the stage.

    A failure prints one line naming what failed and exits 1; the stage writes nothing partial
    because every writer goes through a temporary file and a rename.
    """
    parser = argparse.ArgumentParser(prog=run.__module__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--input", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg: Config = load_config(args.config, args.set)
        inputs = dict(item.split("=", 1) for item in args.input)
        params = dict(item.split("=", 1) for item in args.param)
        args.out.mkdir(parents=True, exist_ok=True)
        run(cfg, args.out, **{k: Path(v) for k, v in inputs.items()}, **params)
    except Int8AlibiError as exc:
        stage = Path(sys.argv[0]).stem if run.__module__ == "__main__" else run.__module__.rsplit(".", 1)[-1]
        print(f"int8alibi: stage {stage} failed: {exc}", file=sys.stderr)
        return 1
    return 0
