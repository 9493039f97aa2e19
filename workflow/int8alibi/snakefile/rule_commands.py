"""The command line of a stage's rule, with every value shell-quoted.

A rule's command runs as Snakemake prints it, from the project root, also when a path holds spaces,
quotes, ``$`` or braces: a literal part is quoted with ``shlex.quote`` (and its braces doubled, so
Snakemake's formatting gives them back as written), and each Snakemake placeholder gets the ``:q``
format, which Snakemake quotes the same way when it fills it in.
"""

from __future__ import annotations

import re
import shlex

from .. import stage_spec

# Snakemake placeholders a command may hold; each is given the `:q` (shell-quote) format.
_PLACEHOLDER = re.compile(r"\{((?:input|output|params|wildcards|log|resources)(?:\.\w+)?)\}")


def q(text: str) -> str:
    """A command fragment with every placeholder shell-quoted (``{input.x}`` becomes ``{input.x:q}``)."""
    return _PLACEHOLDER.sub(r"{\1:q}", text)


def _literal(text: str) -> str:
    """Literal text for a command: shell-quoted, braces doubled for Snakemake's formatting."""
    return shlex.quote(text).replace("{", "{{").replace("}", "}}")


def qpath(path: str) -> str:
    """A path for a command: literal parts quoted, placeholders given ``:q``."""
    parts = _PLACEHOLDER.split(path)  # literal, placeholder, literal, ...
    return "".join(q(f"{{{part}}}") if i % 2 else _literal(part) if part else "" for i, part in enumerate(parts))


def stage_cmd(stage: str, out: str, extra: str = "", python: str = "{params.python:q}") -> str:
    """The one-line command of a stage, relative paths only; ``python`` names another interpreter for
    one running in its own environment (the reference rule).

    Every value is shell-quoted: ``out`` by ``qpath``, the placeholders of ``extra`` by ``q`` (any other
    value goes into ``extra`` through ``qpath``, e.g. ``f"--input results={qpath(RESULTS)}"``, or as a
    param), and the run config as ``{params.run_config:q}`` (the rule's ``stage_params``). A GPU stage's
    command also gives the device memory its job asked for, ``--gpu-mem-mb {resources.gpu_mem_mb:q}``:
    the job claims a device with that much left (``runtime.gpu_slots``). Append the log as
    ``" 2> {log:q}"``.
    """
    gpu = " --gpu-mem-mb {resources.gpu_mem_mb:q}" if stage_spec.stage(stage).gpu else ""
    return (f"{python} -m int8alibi.stages.{stage} --config {{params.run_config:q}} --out {qpath(out)}{gpu} "
            f"{q(extra)}").rstrip()
