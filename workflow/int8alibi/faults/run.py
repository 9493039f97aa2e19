"""Running the fault campaign: one of two engines, chosen per device, streams the layers.

``cells`` (``campaign``) computes a layer cell by cell; ``batched`` (``batched``) computes all cells
of a layer at once on the device and falls back to ``cells`` for a batch whose data would take
another route. Both give the same rows, bit for bit; this module picks one and builds the table.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal

import pandas as pd
import torch

from ..errors import InputError
from ..kernels.layer_operands import Operands
from ..progress import Progress
from .campaign import CampaignSettings, run_layer_cells
from .rows import CellColumns, frame

Engine = Literal["auto", "cells", "batched"]
ENGINES: tuple[Engine, ...] = ("auto", "cells", "batched")


def run_layer(op: Operands, settings: CampaignSettings, device: torch.device | str = "cpu",
              engine: Engine = "auto") -> pd.DataFrame:
    """All cells x checks of one layer, one row each (``CELLS_PER_LAYER * 7`` rows), unscored.

    Columns: layer, block, proj, fault, severity, regime, check, changed_elements, observable,
    max_ulp (None when no finite pair), nonfinite, k_effective, tile_repeats, f7_boost,
    applicable, fired (None when not applicable), reason. ``engine`` as in ``run_campaign``.
    """
    return run_campaign([op], settings, device, progress=False, engine=engine)


def resolve_engine(engine: Engine, device: torch.device) -> Engine:
    """``auto``: the batched engine on a GPU (where per-cell synchronisation idles it), the per-cell
    engine on the CPU (where it is the faster of the two, needing no stacked outputs)."""
    if engine not in ENGINES:
        raise InputError(f"fault campaign: unknown engine {engine!r} (expected one of {', '.join(ENGINES)})")
    if engine == "auto":
        return "batched" if device.type == "cuda" else "cells"
    return engine


def run_campaign(layers: Iterable[Operands], settings: CampaignSettings, device: torch.device | str = "cpu",
                 *, total: int | None = None, progress: bool = True, engine: Engine = "auto",
                 budget: int | None = None) -> pd.DataFrame:
    """Stream ``layers`` through the engine (few layers' tensors alive at a time); progress on stderr.

    ``cells`` computes a layer cell by cell; ``batched`` (``faults.batched``) all cells of a layer
    at once on the device, reading back once per layer, in batches of layers within a share of
    ``budget`` bytes (the run's ``gpu_budget_mb``; None: of the device). Both give the same rows, bit
    for bit, at any budget.
    """
    device = torch.device(device)
    chosen = resolve_engine(engine, device)
    items = Progress(layers, total=total, desc="faults", unit="layer", disable=not progress)
    if chosen == "batched":
        from .batched import run_layers  # its worker processes and device kernels only when asked for

        workers = min(8, (os.cpu_count() or 1) - 1) if device.type == "cuda" else 0
        per_layer: Iterable[CellColumns] = run_layers(items, settings, device, workers, budget=budget)
    else:
        per_layer = (run_layer_cells(op, settings, device) for op in items)
    parts = list(per_layer)
    if not parts:
        raise InputError("fault campaign: no layers to run")
    return frame(CellColumns.concat(parts), settings.thresholds)
