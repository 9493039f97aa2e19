"""Stage 2, model: the bf16 parent, made once and saved with a verifiable record.

Loads the parent from the configured source (the GGUF package is dequantized here, once), saves
it with ``save_pretrained`` (safetensors) plus its tokenizer under ``<out>/parent``, reloads the
saved copy and checks that its tensors and tokenizer are the ones that were saved, then writes
``parent.parquet`` (every file's digest, the tensors' content digest, architecture, tokenizer
digest, layer count) and the manifest. Nothing appears unless all of it succeeded.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..errors import InputError
from ..files.atomic import temp_dir
from ..provenance.manifest import write_manifest
from ..files.parquet import write_table
from ..model.sources import (DEFAULT_GGUF_PACKAGE, PARENT_DIR, PARENT_KEY, PARENT_SCHEMA, PARENT_TABLE, ParentInfo,
                             gguf_package_file, load_hf_dir, load_source, parent_record, tensors_digest,
                             tokenizer_digest)
from ..model.portable import keep_float32_copies
from ..runtime.runner import stage_main

log = logging.getLogger("int8alibi.model")
ROUND_TRIP_TOKENS = 32


def _save_verified(model: Any, tokenizer: Any, info: ParentInfo, target: Path) -> ParentInfo:
    """Save into a temporary directory, reload, compare, then rename onto ``target``."""
    tmp = temp_dir(target.parent, target.name)
    start = time.perf_counter()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        log.info("model: saved in %.1f s", time.perf_counter() - start)
        reloaded, retok = load_hf_dir(tmp)
        if tensors_digest(reloaded) != info.sha256:
            raise InputError(f"{tmp}: the saved parent's tensors differ from the loaded ones (save/reload round trip)")
        ids = torch.arange(1, ROUND_TRIP_TOKENS + 1)[None, :] % reloaded.config.vocab_size
        for each in (model, reloaded):  # two models run once: no float32 weight copies (2x their bytes) kept
            keep_float32_copies(each, False)
        with torch.no_grad():
            same = torch.equal(model(input_ids=ids, use_cache=False).logits,
                               reloaded(input_ids=ids, use_cache=False).logits)
        if not same:  # e.g. a buffer (rotary frequencies) kept in another precision than after reloading
            raise InputError(f"{tmp}: the saved parent computes different logits from the loaded one")
        log.info("model: reloaded, digested and run twice (CPU, %d tokens) by %.1f s", ROUND_TRIP_TOKENS,
                 time.perf_counter() - start)
        saved_tok = tokenizer_digest(retok)
        probe = "The quick brown fox: 12,345 tokens — naïve café.\n"
        if retok(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
            raise InputError(f"{tmp}: the saved tokenizer encodes text differently from the source tokenizer")
        for path in tmp.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp.chmod(0o755)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return replace(info, tokenizer_digest=saved_tok)


def run(cfg: Config, out_dir: Path) -> None:
    """Load the configured parent, save it under ``out_dir/parent``, record it, write the manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / "manifest.json", out_dir / PARENT_TABLE):  # never leave an earlier run's record
        stale.unlink(missing_ok=True)
    shutil.rmtree(out_dir / PARENT_DIR, ignore_errors=True)
    start = time.perf_counter()
    model, tokenizer, info = load_source(cfg)
    log.info("model: %s %s, %s, %d blocks, %d quantized linears, loaded and digested in %.1f s", info.source,
             info.origin, info.architecture, info.n_blocks, info.n_layers, time.perf_counter() - start)
    parent_dir, table, manifest = out_dir / PARENT_DIR, out_dir / PARENT_TABLE, out_dir / "manifest.json"
    try:
        info = _save_verified(model, tokenizer, info, parent_dir)
        write_table(parent_record(info, parent_dir), table, PARENT_SCHEMA, PARENT_KEY)
        _manifest(cfg, out_dir, info, parent_dir, table)
    except BaseException:  # a failed stage leaves no partial output
        shutil.rmtree(parent_dir, ignore_errors=True)
        table.unlink(missing_ok=True)
        manifest.unlink(missing_ok=True)
        raise


def _manifest(cfg: Config, out_dir: Path, info: ParentInfo, parent_dir: Path, table: Path) -> None:
    model_cfg = dict(cfg["model"])
    inputs = {}
    if info.source == "hf":
        inputs["parent"] = Path(info.origin)
    elif info.source == "gguf-package":
        inputs["gguf"] = gguf_package_file(model_cfg.get("gguf_package") or DEFAULT_GGUF_PACKAGE)
    write_manifest(
        out_dir, stage="model", outputs={"parent": parent_dir, "info": table}, inputs=inputs,
        params={"model": model_cfg},
        extra={"source": info.source, "origin": info.origin, "architecture": info.architecture,
               "n_blocks": info.n_blocks, "n_layers": info.n_layers, "content_sha256": info.sha256,
               "tokenizer_digest": info.tokenizer_digest,
               "dtype": "bfloat16 (GGUF sources: dequantized to float32, rounded once to bf16)"},
    )

if __name__ == "__main__":
    raise SystemExit(stage_main(run))
