"""Portable linears without their float32 weight copies compute the same bits and hold no copy."""

from __future__ import annotations

import torch
from torch import nn

from int8alibi.model.portable import PortableLinear, keep_float32_copies, make_portable


def _model() -> nn.Module:
    g = torch.Generator().manual_seed(7)
    model = nn.Sequential(nn.Linear(64, 48, bias=False), nn.Linear(48, 32, bias=True)).to(torch.bfloat16)
    for p in model.parameters():
        p.data = (torch.randn(p.shape, generator=g) * 0.05).to(torch.bfloat16)
    model.config = type("Config", (), {})()  # make_portable records eager attention in a model's config
    return make_portable(model)


def test_dropping_the_copies_keeps_the_bits_and_frees_them():
    model = _model()
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    kept = model(x)
    assert all("_w32" in m.__dict__ for m in model.modules() if isinstance(m, PortableLinear))
    keep_float32_copies(model, False)
    assert not any("_w32" in m.__dict__ for m in model.modules() if isinstance(m, PortableLinear))
    dropped = model(x)
    assert torch.equal(kept.view(torch.int16), dropped.view(torch.int16))
    assert not any("_w32" in m.__dict__ for m in model.modules() if isinstance(m, PortableLinear))
    keep_float32_copies(model, True)
    assert torch.equal(model(x).view(torch.int16), kept.view(torch.int16))
