"""Run configuration: one YAML file, validated against workflow/schemas/config.schema.yaml.

Paths may name environment variables (``${QWEN3_DIR}``) so the same config serves every machine.

When Snakemake plans a run it decides the *run config*: the user's config with its environment
variables expanded and a ``resolved`` block holding the device and the arm pair that ``auto`` stood
for, with the reason and the host that decided (``int8alibi.planning.resolve``). It lives at
``<results>/.run/<digest>/config.yaml``, one file per expanded config (``run_config_path``), written
once when a run starts executing (never by ``-n``, ``--dag`` or ``--summary``) and never rewritten:
a job reads the file its command names, so a later invocation with other values cannot change what
a running job reads. ``<results>/.run/current`` names the run config of the last run that executed.
Stages read that file and never expand or resolve again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from . import parse_cache, strict_yaml
from .errors import ConfigScopeError, InputError

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
# The block the pipeline writes into the run config when it plans a run (never set by hand).
RESOLVED = "resolved"
# Beside the run configs: the one the last executing run used (for people and the crossmodel view).
CURRENT = "current"
_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class ReadScope:
    """The config keys one stage may read (``int8alibi.planning.stage_needs``), and those it did read.

    Its rule reruns the stage when one of the allowed keys changes and for no other: a stage that
    reads any other key would keep outputs made under a value that no longer holds, so reading one
    raises ``ConfigScopeError`` at once; ``undeclared`` keeps it too, should code catch the error.
    """

    def __init__(self, stage: str, allowed: Iterable[str], free: Iterable[str] = ()) -> None:
        self.stage = stage
        self.allowed = frozenset(allowed)
        self.free = frozenset(free)
        self.read: set[str] = set()
        self.undeclared: set[str] = set()

    def note(self, key: str) -> None:
        if key in self.allowed or key in self.free:
            self.read.add(key)
            return
        self.undeclared.add(key)
        raise ConfigScopeError(f"stage {self.stage} read config key {key!r}, which its rule does not digest (so "
                               f"changing it would not rerun the stage): add it to the stage's config keys in "
                               f"int8alibi.stage_spec.STAGES (it reads: {', '.join(sorted(self.allowed)) or 'none'})")

    @property
    def unread(self) -> list[str]:
        """Declared keys this run did not read (a branch not taken, or a declaration to drop)."""
        return sorted(self.allowed - self.read)


@dataclass(frozen=True)
class Config:
    """A validated configuration plus the file it came from.

    Stages read keys through ``[]``, ``get`` and the properties below, never through ``data``: with
    a ``scope`` (``scoped``), each read is checked against the keys the stage's rule digests.
    ``resolution`` counts as reading ``device`` and ``arms`` (the block stands for both),
    ``resolved_device`` as ``device``, ``resolved_arms`` as ``arms``.
    """

    data: Mapping[str, Any]
    path: Path
    scope: ReadScope | None = field(default=None, compare=False, repr=False)

    def scoped(self, scope: ReadScope) -> Config:
        """This config, letting its reader see only the keys ``scope`` allows."""
        return replace(self, scope=scope)

    def _note(self, *keys: str) -> None:
        if self.scope is not None:
            for key in keys:
                self.scope.note(key)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return self.data.get(key, default)

    @property
    def exploratory(self) -> bool:
        self._note("exploratory")
        return bool(self.data["exploratory"])

    @property
    def results(self) -> Path:
        """The results folder: ``results`` (relative), under ``results_root`` when the config names one."""
        self._note("results", "results_root")
        return Path(results_location(self.data))

    @property
    def resolution(self) -> Mapping[str, Any] | None:
        """The ``resolved`` block of a run config (device, arms, reason, host), or None for a user config."""
        self._note("device", "arms")
        return self._resolution()

    def _resolution(self) -> Mapping[str, Any] | None:
        block = self.data.get(RESOLVED)
        if block is None:
            return None
        spec = {"device": self.data["device"], "arms": self.data["arms"]}
        if "engine" in self.data:
            spec["engine"] = self.data["engine"]
        if block["spec"] != spec:
            raise InputError(f"{self.path}: the resolved block was planned for device {block['spec']['device']!r}, "
                             f"arms {block['spec']['arms']!r}, but the config now says device {spec['device']!r}, "
                             f"arms {spec['arms']!r}; let Snakemake plan the run again (it rewrites this file)")
        return block

    @property
    def resolved_device(self) -> str:
        """``cpu`` or ``cuda``: the run's device as resolved once when the run was planned (or as named)."""
        self._note("device")
        block = self._resolution()
        if block is not None:
            return str(block["device"])
        if self.data["device"] == "auto":
            raise InputError(_unresolved(self.path, "device"))
        return str(self.data["device"])

    @property
    def device_origin(self) -> tuple[str, str] | None:
        """``(host, reason)`` the run's device was resolved with, or None for a user config; reads ``device`` only
        (a stage that reads no arms can still say where its device came from)."""
        self._note("device")
        block = self._resolution()
        return None if block is None else (str(block["host"]), str(block["reason"]["device"]))

    @property
    def resolved_engine(self) -> str:
        """``own`` or ``vllm``: the determinism stage's engine as resolved when the run was planned."""
        block = self.resolution
        if block is None or "engine" not in block:
            raise InputError(f"{self.path}: no resolved engine (the run was planned before engines were resolved, "
                             "or this is not a run config); let Snakemake plan the run again")
        return str(block["engine"])

    @property
    def gpu_budget_bytes(self) -> int | None:
        """The device-memory budget the run was planned with, in bytes (``planning.resolve.resolve_budget``),
        or None: no budget (a CPU run's ``auto``, a run planned before budgets, a user config)."""
        self._note("gpu_budget_mb")
        block = self.data.get(RESOLVED) or {}
        mb = (block.get("gpu_budget") or {}).get("mb")
        return None if mb is None else int(mb) << 20

    @property
    def resolved_arms(self) -> list[str]:
        """The two arm names of the run, as resolved once when the run was planned (or as named)."""
        self._note("arms")
        block = self._resolution()
        if block is not None:
            return [str(a) for a in block["arms"]]
        if self.data["arms"] == "auto":
            raise InputError(_unresolved(self.path, "arms"))
        return [str(a) for a in self.data["arms"]]


def _unresolved(path: Path, key: str) -> str:
    return (f"{path}: {key}: auto is resolved once per run, when Snakemake plans it (the 'resolved' block of "
            f"<results>/.run/<digest>/config.yaml); this config has no such block: run the stage through Snakemake, "
            f"pass that run config, or name the {key} explicitly")


# One path segment of `results` / `results_root`: letters, digits and ._+- , not starting with a dot
# (so no `.`/`..` and no hidden folder). Paths reach command lines: quoted there, and also plain.
_SEGMENT = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,99}")


# Top-level folders of a checkout that hold the project itself, its environments or Snakemake's and
# the pipeline's own bookkeeping (envs/: where earlier checkouts kept the environments):
# a results folder inside one would mix stage folders into them.
PROJECT_FOLDERS = frozenset({
    "amendments", "benchmarks", "config", "dev", "docs", "envs", "logs", "preregistration", "profiles",
    "requirements", "tests", "workflow", ".git", ".snakemake", ".venv", ".venv-llmcompressor",
})
# What marks a folder as a checkout of a project (this one or another): a results folder under
# results_root that lands inside one gets the same project-folder check as one inside this checkout.
CHECKOUT_MARKERS = ("Snakefile", "amendments", "preregistration")


def results_location(data: Mapping[str, Any]) -> str:
    """``results`` as written, or ``<results_root>/<results>`` when the config names ``results_root``."""
    results = str(data.get("results", "results"))
    root = data.get("results_root")
    return results if root is None else f"{str(root).rstrip('/')}/{results}"


def results_dir(data: Mapping[str, Any], checkout: Path, source: str = "config") -> str:
    """The run's results folder, checked: ``results`` is a relative path of plain segments that stays
    inside the checkout after resolving symlinks; ``results_root`` (the documented escape hatch, an
    absolute path of plain segments) puts it elsewhere. Wherever it lands it is a folder of its own:
    not a file, not the top of a checkout nor inside one's project folders (``amendments/`` of another
    checkout would refuse every run there). Anything else is refused naming the value."""
    results = data.get("results", "results")
    if not isinstance(results, str) or not all(_SEGMENT.fullmatch(p) for p in results.split("/")):  # absolute too
        raise InputError(f"{source}: results {_short_text(results)!r} is not a relative path of plain segments "
                         "(letters, digits, ._+-, not starting with a dot, '/' between); to write results "
                         "outside the checkout use --config results_root=/absolute/folder")
    root = data.get("results_root")
    if root is not None:
        parts = str(root).rstrip("/").split("/")
        if (not isinstance(root, str) or not root.startswith("/") or len(root) > 1000
                or not all(_SEGMENT.fullmatch(p) for p in parts[1:])):
            raise InputError(f"{source}: results_root {_short_text(root)!r} must be an absolute path of plain "
                             "segments (letters, digits, ._+-, not starting with a dot)")
    inside = Path(checkout).resolve()
    shown = results_location(data)
    target = (Path.cwd() / shown).resolve()
    if root is None and (target == inside or inside not in target.parents):
        raise InputError(f"{source}: results {results!r} resolves to {target}, outside the checkout {inside} "
                         "(a symlink out of the tree?); results stay inside the checkout unless you name "
                         "--config results_root=/absolute/folder")
    try:
        for checkout_root in (inside, *(p for p in (target, *target.parents) if _is_checkout(p))):
            if target == checkout_root or checkout_root in target.parents:
                _refuse_project_folder(source, shown, target, checkout_root)
        _refuse_non_folder(source, shown, target)
    except OSError as exc:  # e.g. a parent this user may not read
        raise InputError(f"{source}: results {shown!r} resolves to {target}, which cannot be examined "
                         f"({exc.strerror or exc}: {exc.filename})") from None
    if results.split("/")[0] in PROJECT_FOLDERS:  # under results_root too: a results folder is never named so
        raise InputError(f"{source}: results {shown!r} names a project folder ({results.split('/')[0]}/), "
                         "not a results folder; choose a folder of its own, e.g. results/<name>")
    return shown


def _is_checkout(folder: Path) -> bool:
    return any(os.path.lexists(folder / marker) for marker in CHECKOUT_MARKERS)


def _refuse_project_folder(source: str, results: str, target: Path, inside: Path) -> None:
    parts = target.relative_to(inside).parts
    if not parts or parts[0] in PROJECT_FOLDERS:
        where = f"the project's own folder {parts[0]}/" if parts else f"the top folder of the checkout {inside}"
        raise InputError(f"{source}: results {results!r} resolves to {target}, inside {where} (stage folders "
                         "would be written among its files); choose a folder of its own, e.g. results/<name>")


def _present(path: Path) -> bool:
    """Whether ``path`` exists; an error other than its absence (no permission) is raised, not hidden."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _refuse_non_folder(source: str, results: str, target: Path) -> None:
    """The nearest existing one of ``target`` and its parents must be a folder: stages make their
    folders below it, and a file there would stop the first of them with an OSError."""
    existing = next(p for p in (target, *target.parents) if _present(p))
    if not existing.is_dir():
        which = "it" if existing == target else str(existing)
        raise InputError(f"{source}: results {results!r} resolves to {target}, but {which} is an existing "
                         "file, not a folder; name a folder for the results")


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise InputError(f"override {text!r}: expected key=value (e.g. exploratory=true)")
    key, value = text.split("=", 1)
    return key.split("."), strict_yaml.parse(value, f"override {key}")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (YAML-typed values), as Snakemake's --config does."""
    out = copy.deepcopy(data)
    items = overrides.items() if isinstance(overrides, Mapping) else (_parse_override(o) for o in overrides)
    for key, value in items:
        parts = key.split(".") if isinstance(key, str) else key
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _variables(text: str) -> list[str]:
    return [braced or bare for braced, bare in _VARIABLE.findall(text)]


def _expand_env(value: Any, unset: list[str] | None = None, where: str = "") -> Any:
    """Expand ``$VAR``/``${VAR}`` in every string; an unset variable raises, or is left as written
    and its ``(where, name)`` appended to ``unset`` when a list is given."""
    if isinstance(value, str):
        expanded = os.path.expandvars(value)
        left = _variables(expanded)
        if left:
            if unset is None:
                raise InputError(f"config value {value!r}{f' ({where})' if where else ''} names environment "
                                 f"variable {left[0]}, which is not set")
            unset.extend(f"{where or '(top level)'}: ${{{name}}}" for name in left)
        return expanded
    if isinstance(value, Mapping):
        return {k: _expand_env(v, unset, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, unset, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def expand_env(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with environment variables expanded, and the ``"key: ${VAR}"`` entries left unexpanded
    because the variable is not set (those stay as written: a job that reads the run config then stops)."""
    unset: list[str] = []
    return _expand_env(dict(data), unset), unset


def _written_variables(value: Any, where: str = "") -> list[str]:
    """``"key: ${VAR}"`` for every variable reference written in ``value`` (nothing is expanded)."""
    if isinstance(value, str):
        return [f"{where or '(top level)'}: ${{{name}}}" for name in _variables(value)]
    if isinstance(value, Mapping):
        return [hit for k, v in value.items() for hit in _written_variables(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in _written_variables(v, f"{where}[{i}]")]
    return []


def _check_planned(data: Mapping[str, Any], path: Path) -> None:
    """A run config was expanded when the run was planned: a variable left in it was not set then.

    It is not expanded now (the value this host would give is not what the run was planned with).
    """
    written = _written_variables({k: v for k, v in data.items() if k != RESOLVED})
    if written:
        host = data[RESOLVED].get("host", "the planning host")
        raise InputError(f"{path}: {written[0]} was not expanded: the environment variable was not set when "
                         f"Snakemake planned this run on host {host}; set it and run snakemake again")


# At most this many values (mappings, lists, scalars) in a config: a real one has about fifty.
MAX_NODES = 10_000


def check_bounded(data: Any, source: str) -> None:
    """Refuse a config whose values share a container (a YAML alias, expanded by any walk) or that
    holds more than ``MAX_NODES`` values, before anything walks it (validation, digests, dumps)."""
    seen: set[int] = set()
    stack, count = [data], 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise InputError(f"{source}: more than {MAX_NODES} values; a config is small")
        if isinstance(node, (Mapping, list, tuple)):
            if id(node) in seen:
                raise InputError(f"{source}: a value is repeated by reference (a YAML alias); anchors and aliases "
                                 "are not allowed in a config")
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, Mapping) else node)


def command_line_booleans(config: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Read ``--config key=true`` / ``=false`` (YAML's spelling, which Snakemake leaves a string) as a
    boolean for the keys the schema types boolean; Snakemake itself converts only True/False."""
    schema = strict_yaml.read(SCHEMA_PATH)["properties"]
    for key, value in overrides.items():
        if schema.get(key, {}).get("type") == "boolean" and value in ("true", "false") and config.get(key) == value:
            config[key] = value == "true"


def validate(data: Mapping[str, Any], source: str) -> None:
    """Raise InputError naming the file and the first schema violation."""
    schema = strict_yaml.read(SCHEMA_PATH)
    parse_cache.validated(schema, dict(data), lambda: _check(dict(data), schema, source))


def _check(data: dict[str, Any], schema: Any, source: str) -> None:
    import jsonschema  # imported when a config is validated anew (planning an unchanged one needs none)

    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(_short_text(p, 60) for p in exc.absolute_path) or "(top level)"
        raise InputError(f"{source}: invalid config at {where}: {_schema_message(exc)}") from None
    except RecursionError:
        raise InputError(f"{source}: invalid config: nested too deeply") from None


def _short_text(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _schema_message(exc: Any) -> str:
    """The schema's complaint, without dumping a huge value: the offending value is shortened."""
    if len(exc.message) <= 300:
        return exc.message
    return f"{_short_text(exc.instance)} fails the schema's {exc.validator!r} rule ({_short_text(exc.validator_value)})"


def load_config(path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = ()) -> Config:
    """Load, override, expand environment variables and validate a config file.

    A run config (one with a ``resolved`` block) is not expanded again: a variable still written in
    it was unset when the run was planned, and reading it stops with an error naming the variable.
    """
    path = Path(path)
    raw = strict_yaml.read(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path}: config must be a mapping")
    data = apply_overrides(raw, overrides)
    if RESOLVED in data:  # a run config: expanded and resolved when the run was planned; read, never redo
        validate(data, str(path))
        _check_planned(data, path)
    else:
        data = _expand_env(data)
        validate(data, str(path))
    return Config(data=data, path=path)


def read_run_config(path: str | Path) -> dict[str, Any] | None:
    """The run config an earlier plan wrote at ``path``, or None when there is none.

    A file that exists but does not read as a mapping is an error naming it (run state is never
    silently replaced)."""
    path = Path(path)
    if not path.exists():
        return None
    data = strict_yaml.read(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: a run config must be a mapping; delete the file to plan the run again")
    return data


def config_key(data: Mapping[str, Any]) -> str:
    """Digest of an expanded user config (without a ``resolved`` block): names its run config."""
    body = {k: v for k, v in data.items() if k != RESOLVED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_config_path(results: str, data: Mapping[str, Any]) -> str:
    """``<results>/.run/<digest>/config.yaml``: the run config of this expanded config."""
    return f"{results}/.run/{config_key(data)}/config.yaml"


def current_run_config(results: str | Path) -> Path | None:
    """The run config the last executing run of ``results`` used (``.run/current``), or None."""
    pointer = Path(results) / ".run" / CURRENT
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    if not re.fullmatch(r"[0-9a-f]{16}/config\.yaml", name):
        raise InputError(f"{pointer}: expected '<digest>/config.yaml', found {_short_text(name)}")
    return Path(results) / ".run" / name


def earlier_plan(path: str | Path, results: str | Path, expanded: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plan to reuse for ``expanded``: its own run config at ``path`` if written (refused when its body
    no longer matches the config it is named after), else the run config of the last executing run."""
    own = read_run_config(path)
    if own is not None:
        if {k: v for k, v in own.items() if k != RESOLVED} != dict(expanded):
            raise InputError(f"{path}: this run config was edited after it was written (it no longer holds the "
                             "config it is named after); delete its folder to plan the run again")
        return own
    current = current_run_config(results)
    return read_run_config(current) if current is not None else None


def write_run_config(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write the run config once, atomically, and point ``.run/current`` at it.

    An existing file is never rewritten (running jobs may be reading it); one whose content differs
    from ``data`` was edited by hand or planned differently, and is refused naming it.
    """
    from .files.atomic import write_bytes

    path = Path(path)
    text = yaml.safe_dump(dict(data), sort_keys=True)
    if path.exists():
        if read_run_config(path) != strict_yaml.parse(text, str(path)):
            raise InputError(f"{path}: this run config differs from the plan made now for the same config; it is "
                             "never rewritten: delete its folder to plan the run again")
    else:
        write_bytes(path, text.encode())
    write_bytes(path.parent.parent / CURRENT, f"{path.parent.name}/{path.name}\n".encode())
    return path
