"""Small seeded layers and the pinned campaign settings, shared by the fault-campaign tests.

Layers are tiny (M=16, K=256, N=64 and a second shape with K not a multiple of the F5 tile) so the
whole campaign over three layers runs in about a second on one CPU core.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from int8alibi.faults import CampaignSettings, run_campaign
from int8alibi.kernels.layer_operands import ModelShapes, Operands, synthetic_layers
from int8alibi.protocol import load

PROJECT = Path(__file__).resolve().parents[2]
SMALL = ModelShapes(1, (("mlp", "up_proj", 256, 64), ("mlp", "down_proj", 320, 48), ("self_attn", "o_proj", 256, 32)))


def small_layers(m: int = 16, seed: int = 0) -> list[Operands]:
    """Three seeded layers of small shapes (one with K = 320, not a multiple of 128)."""
    return list(synthetic_layers(SMALL, m=m, seed=seed))


@pytest.fixture(scope="session")
def protocol():
    return load(PROJECT / "preregistration")


@pytest.fixture(scope="session")
def settings(protocol) -> CampaignSettings:
    return CampaignSettings.from_protocol(protocol)


@pytest.fixture(scope="session")
def layers() -> list[Operands]:
    return small_layers()


@pytest.fixture(scope="session")
def campaign_rows(layers, settings) -> pd.DataFrame:
    """The unscored campaign over the small layers, on CPU."""
    return run_campaign(layers, settings, torch.device("cpu"), progress=False)
