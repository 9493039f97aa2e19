"""Where the campaign's (and conform's) layer operands come from, and which layers are selected.

The campaign runs on the operands the capture stage recorded for the checkpoint under test
(``own``) in the prefill phase. ``operands`` may name that capture index, a directory holding
it, a directory of operand files written by ``layer_operands.save_operands``, or one such file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from ..errors import InputError
from ..kernels.layer_operands import Operands, load_operands
from ..kernels.capture_index import index_inputs, iter_index_operands, read_index

CHECKPOINT = "own"
PHASE = "prefill"
INDEX_NAME = "index.parquet"


@dataclass(frozen=True)
class LayerSelection:
    """Layers [start, stop) of the source, in its order (stop None: to the end)."""

    start: int = 0
    stop: int | None = None

    @classmethod
    def parse(cls, layers: str | int | None = None, layer_range: str | None = None) -> "LayerSelection":
        """``layers=N``: the first N layers; ``layer_range=START:STOP``: a slice (either end may be empty)."""
        if layers is not None and layer_range is not None:
            raise InputError("give either layers=N or layer_range=START:STOP, not both")
        if layers is not None:
            n = _int(layers, "layers")
            if n < 1:
                raise InputError(f"layers={layers!r}: must be at least 1")
            return cls(0, n)
        if layer_range is not None:
            start_text, sep, stop_text = str(layer_range).partition(":")
            if not sep:
                raise InputError(f"layer_range={layer_range!r}: expected START:STOP")
            start = _int(start_text, "layer_range start") if start_text else 0
            stop = _int(stop_text, "layer_range stop") if stop_text else None
            if start < 0 or (stop is not None and stop <= start):
                raise InputError(f"layer_range={layer_range!r}: need 0 <= START < STOP")
            return cls(start, stop)
        return cls()

    def describe(self) -> str:
        return f"{self.start}:{'' if self.stop is None else self.stop}"

    def apply(self, layers: Iterator[Operands]) -> Iterator[Operands]:
        return islice(layers, self.start, self.stop)

    def count(self, total: int | None) -> int | None:
        """How many of ``total`` layers the selection keeps (None when the total is unknown)."""
        if total is None:
            return None
        return max(0, min(total, total if self.stop is None else self.stop) - self.start)


def _int(text: str | int, what: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise InputError(f"{what}={text!r} is not an integer") from None


@dataclass(frozen=True)
class OperandSource:
    """A resolved operand source: how many layers it holds, its files, and a layer iterator."""

    path: Path
    index: Path | None
    files: tuple[Path, ...]

    @classmethod
    def resolve(cls, path: str | Path) -> "OperandSource":
        """Classify ``path``; InputError naming it when it is none of the accepted kinds."""
        p = Path(path)
        if p.is_dir() and (p / INDEX_NAME).is_file():
            p = p / INDEX_NAME
        if p.is_file() and p.suffix == ".parquet":
            read_index(p)
            return cls(p, p, tuple(index_inputs(p).values()))
        if p.is_file() and p.suffix == ".safetensors":
            return cls(p, None, (p,))
        if p.is_dir():
            files = tuple(sorted(p.glob("*.safetensors")))
            if files:
                return cls(p, None, files)
        raise InputError(f"{p}: not a capture index, a directory with {INDEX_NAME}, or operand safetensors file(s)")

    def inputs(self) -> dict[str, Path]:
        """Manifest inputs: the index (if any) and every operand file."""
        named = {"operands": self.index} if self.index is not None else {}
        return {**named, **{f.name: f for f in self.files}}

    def layer_count(self) -> int | None:
        """Layers in the source when the index says so (for progress); None for bare files."""
        if self.index is None:
            return None
        frame = read_index(self.index)
        return int(((frame.checkpoint == CHECKPOINT) & (frame.phase == PHASE)).sum())

    def layers(self) -> Iterator[Operands]:
        """The layers in order: the index's own/prefill layers in model order, or each file's."""
        if self.index is not None:
            for _, op in iter_index_operands(self.index, CHECKPOINT, PHASE):
                yield op
            return
        for f in self.files:
            yield from load_operands(f)
