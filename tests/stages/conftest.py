"""Shared set-up for stage tests: the tiny synthetic model through the real model and requant stages."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import yaml

from int8alibi.config import Config, load_config
from int8alibi.stages import model as model_stage
from int8alibi.stages import requant

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, list[str]], tuple[Path, Config]]:
    """Build (config file, config) for the tiny model with ``arms``, after running model and requant."""

    def build(name: str, arms: list[str]) -> tuple[Path, Config]:
        tmp = tmp_path_factory.mktemp(name)
        data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
        data.update(model={"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}},
                    size_profile="tiny", corpus={"source": "synthetic", "path": None}, device="cpu", arms=arms,
                    results=str(tmp / "results"))
        path = tmp / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        cfg = load_config(path)
        model_stage.run(cfg, cfg.results / "model")
        requant.run(cfg, cfg.results / "requant", parent=cfg.results / "model" / "parent.parquet",
                    protocol=ROOT / "preregistration")
        return path, cfg

    return build
