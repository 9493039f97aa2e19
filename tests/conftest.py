"""Suite-wide set-up: the pipeline's portable CPU settings, and the tiny model through model + requant.

The settings are applied before any test module runs torch's first CPU kernel (ATen reads its
capability and MKL its reproducibility branch then), so in-process stage runs give the bytes a
Snakemake job gives.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from int8alibi import portable  # noqa: E402

portable.apply_to_environ()

from int8alibi.config import Config, load_config  # noqa: E402
from int8alibi.stages import model as model_stage  # noqa: E402
from int8alibi.stages import requant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def user_config(**overrides: object) -> dict:
    """The embedded default config as a user's file holds it, with ``overrides`` set."""
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data.update(overrides)
    return data


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty checkout folder, made the working directory (results folders resolve inside it)."""
    root = tmp_path / "checkout"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


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
