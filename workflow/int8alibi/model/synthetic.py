"""Seeded Qwen3 decoders with real architectures and no download: a tiny one for tests, and the
papers' Qwen3-1.7B, 8B and 14B shapes for runs at their scale without their weights.

``tiny`` draws each parameter from its own CPU generator seeded by (seed, parameter name) and uses
the GGUF package's tokenizer (the test suite's pinned bytes are made from it). The paper-scale
presets take their weights from ``seeded_weights`` (a counter-based integer hash: the same bits on
any machine, thread count or chunking, and fast enough for 14B) and the byte tokenizer
(``byte_tokenizer``), so they need no package beyond the pipeline's own. Either way matrices have
standard deviation 0.02 and are symmetric (rows whose absmax is negative are as common as in a real
model), norm weights are 1 + the same, all bf16; the paper presets' matrix rows also carry their own
gains (0.25 to 1.75), so their int8 scales spread over octaves as a trained model's do. Every
linear's K and N are multiples of 16 (kernel tiles).

``python -m int8alibi.model.synthetic --preset qwen3-1.7b --out DIR`` writes a preset as a Hugging
Face folder (config, tokenizer, sharded safetensors), one shard in memory at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import Int8AlibiError, InputError
from ..files.atomic import temp_dir
from .seeded_weights import default_threads, seeded_tensor
from .synthetic_presets import PRESETS, Preset, preset, synthetic_config_fields

WEIGHT_STD = 0.02
NORM_OFFSET = 1.0
SHARD_BYTES = 4 << 30  # safetensors shard size of a written folder


def synthetic_config(name: str = "tiny", vocab_size: int | None = None, **overrides: Any) -> Any:
    """The ``Qwen3Config`` of preset ``name`` (vocabulary: ``vocab_size``, else the preset's)."""
    from transformers import Qwen3Config

    fields = {k: v for k, v in synthetic_config_fields(name, vocab_size).items() if k != "model_type"}
    config = Qwen3Config(**{**fields, **overrides})
    config.architectures = ["Qwen3ForCausalLM"]
    config.dtype = torch.bfloat16
    return config


def parameter_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every stored parameter (a tied head once, as the embedding), in module order,
    from a model built on the meta device: no memory is allocated."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def _std_offset(name: str) -> tuple[float, float]:
    return WEIGHT_STD, NORM_OFFSET if name.endswith("norm.weight") else 0.0


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"int8alibi-synthetic|{seed}|{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def synthetic_tensor(spec: Preset, seed: int, name: str, shape: tuple[int, ...], *,
                     threads: int | None = None) -> torch.Tensor:
    """Parameter ``name`` of a preset under ``seed``: a bf16 CPU tensor that depends on nothing else."""
    std, offset = _std_offset(name)
    if spec.weights == "counter-hash":
        return seeded_tensor(shape, seed, name, std, offset, threads=threads)
    values = torch.randn(shape, generator=_generator(seed, name)) * std
    return (values + offset if offset else values).to(torch.bfloat16)


def build_synthetic(name: str = "tiny", seed: int = 0, vocab_size: int | None = None, *,
                    threads: int | None = None, **overrides: Any) -> Any:
    """A bf16 ``Qwen3ForCausalLM`` (CPU, eval mode) whose weights are a function of (preset, seed) only.

    Built on the meta device and filled parameter by parameter, so it holds one copy of its weights.
    """
    from transformers import Qwen3ForCausalLM

    if seed < 0:
        raise InputError(f"synthetic model: seed={seed} must be >= 0")
    spec = preset(name)
    config = synthetic_config(name, vocab_size, **overrides)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    # Parameters become bf16; buffers (rotary inverse frequencies) are made on the CPU in float32,
    # as in a loaded model.
    model.to(torch.bfloat16).to_empty(device="cpu")  # type: ignore[arg-type]  # transformers types .to by a wrapper
    model.model.rotary_emb = type(model.model.rotary_emb)(config)
    for pname, param in sorted(model.named_parameters()):
        param.data = synthetic_tensor(spec, seed, pname, tuple(param.shape), threads=threads)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def preset_tokenizer(name: str, gguf_package: str | None = None) -> Any:
    """The tokenizer a preset is paired with: the GGUF package's for ``tiny``, else the byte tokenizer."""
    if preset(name).tokenizer == "bytes":
        from .byte_tokenizer import byte_tokenizer

        return byte_tokenizer()
    from .package import DEFAULT_GGUF_PACKAGE, gguf_tokenizer

    return gguf_tokenizer(gguf_package or DEFAULT_GGUF_PACKAGE)


def synthetic_parent(name: str, seed: int, gguf_package: str | None = None, *,
                     threads: int | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a preset: ``tiny``'s vocabulary is its tokenizer's, the paper-scale
    presets keep Qwen3's (the byte tokenizer then uses ids 0..255 of it)."""
    tokenizer = preset_tokenizer(name, gguf_package)
    vocab = len(tokenizer) if preset(name).tokenizer == "gguf-package" else None
    model = build_synthetic(name, seed, vocab_size=vocab, threads=threads)
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"synthetic model {name!r}: tokenizer has {len(tokenizer)} tokens, "
                         f"vocabulary {model.config.vocab_size}")
    return model, tokenizer


def _shards(shapes: dict[str, tuple[int, ...]], shard_bytes: int) -> list[list[str]]:
    """Parameter names grouped in order into shards of at most ``shard_bytes`` (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for pname, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(pname)
        size += nbytes
    return shards


def write_synthetic(name: str, seed: int, out_dir: str | Path, *, shard_bytes: int = SHARD_BYTES,
                    threads: int | None = None, progress: Any = None) -> Path:
    """Write preset ``name`` under ``seed`` as a Hugging Face folder ``out_dir`` (which must not exist).

    The folder is built beside ``out_dir`` and renamed onto it when complete; one shard's tensors are
    in memory at a time. Loading it gives the model ``build_synthetic`` builds, tensor for tensor.
    """
    from safetensors.torch import save_file

    target = Path(out_dir)
    if target.exists():
        raise InputError(f"{target}: already exists; the synthetic parent is written into a new folder")
    if shard_bytes < 1:
        raise InputError(f"synthetic model: shard_bytes={shard_bytes} must be >= 1")
    spec, config = preset(name), synthetic_config(name)
    tokenizer = preset_tokenizer(name)
    if len(tokenizer) > config.vocab_size:
        raise InputError(f"synthetic model {name!r}: tokenizer has {len(tokenizer)} tokens, vocabulary {config.vocab_size}")
    shapes = parameter_shapes(config)
    groups = _shards(shapes, shard_bytes)
    files = ["model.safetensors"] if len(groups) == 1 else [
        f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    tmp = temp_dir(target.parent, target.name)
    try:
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for file, group in zip(files, groups):
            tensors = {p: synthetic_tensor(spec, seed, p, shapes[p], threads=threads) for p in group}
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            if progress is not None:
                progress(file, sum(t.numel() for t in tensors.values()))
            del tensors
        if len(files) > 1:
            index = {"metadata": {"total_size": sum(2 * torch.Size(s).numel() for s in shapes.values())},
                     "weight_map": {p: f for f, group in zip(files, groups) for p in group}}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        for path in tmp.iterdir():  # readable by others, like any model folder (mkdtemp makes it private)
            path.chmod(0o644)
        tmp.chmod(0o755)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    """CLI of ``write_synthetic``; prints the weights per second it reached."""
    parser = argparse.ArgumentParser(prog="python -m int8alibi.model.synthetic",
                                     description="Write a seeded synthetic Qwen3 as a Hugging Face folder.")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, help="a new folder")
    parser.add_argument("--threads", type=int, default=None, help=f"default: the CPUs this process may use ({default_threads()})")
    parser.add_argument("--shard-gib", type=float, default=SHARD_BYTES / 2**30)
    args = parser.parse_args(argv)
    start, done = time.perf_counter(), [0]

    def progress(file: str, count: int) -> None:
        done[0] += count
        print(f"{file}: {count:,} weights; {done[0] / (time.perf_counter() - start):,.0f} weights/s so far", flush=True)

    try:
        write_synthetic(args.preset, args.seed, args.out, shard_bytes=int(args.shard_gib * 2**30),
                        threads=args.threads, progress=progress)
    except Int8AlibiError as exc:
        print(f"int8alibi: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    print(f"{args.out}: {done[0]:,} weights in {seconds:.1f} s ({done[0] / seconds:,.0f} weights/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
