"""The layer-level fault campaign (preregistration/faults.yaml): reference pipeline, fault catalogue, cells.

``reference`` is arm A; ``catalogue`` is the one home of fault application (F1..F9 on stacks of
GEMMs or one, used by both engines and by ``tokens.inject``); ``run_layer`` runs all 42
cells x 7 checks of one layer and ``run_campaign`` streams layers through it.
"""

from .campaign import CELLS_PER_LAYER, CampaignSettings
from .run import run_campaign, run_layer
from .pipeline import reference

__all__ = ["CELLS_PER_LAYER", "CampaignSettings", "reference", "run_campaign", "run_layer"]
