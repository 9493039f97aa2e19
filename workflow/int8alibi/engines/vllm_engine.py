"""The vLLM backend: greedy generation by vLLM itself, one arm per fresh process, kernel verified.

vLLM picks its INT8 scaled-mm kernel at model load, in priority order (on CUDA: CUTLASS, then
Triton); the environment variable ``VLLM_DISABLED_KERNELS`` removes named kernel classes from
that list, which is how the Triton arm is forced. vLLM logs its choice once per process
("Selected <KernelClass> for <Scheme>"); that line is the only evidence of what ran, so it is
parsed and a run whose selected kernel is not the requested one is refused, never recorded.

Everything here except ``_child_main`` runs without vLLM or a GPU (argument building,
environment, log parsing, refusal) and is unit-tested on CPU. vLLM is imported only inside the
child process, never at package import.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..kernels.base import package_version
from ..files.hashing import sha256_bytes

DISABLE_VAR = "VLLM_DISABLED_KERNELS"
CUTLASS_KERNEL = "CutlassInt8ScaledMMLinearKernel"
TRITON_KERNEL = "TritonInt8ScaledMMLinearKernel"
INT8_SCHEME = "CompressedTensorsW8A8Int8"

# Requested kernel class and the VLLM_DISABLED_KERNELS value that makes vLLM select it on CUDA.
ARM_KERNELS: dict[str, tuple[str, str | None]] = {
    "vllm-cutlass": (CUTLASS_KERNEL, None),
    "vllm-triton": (TRITON_KERNEL, CUTLASS_KERNEL),
}

# Fixed settings for the child: INFO logs without colour (the selection line is INFO), the engine
# core in this process (one log stream), no sampling randomness left to chance.
CHILD_ENV: dict[str, str] = {
    "VLLM_LOGGING_LEVEL": "INFO",
    "VLLM_CONFIGURE_LOGGING": "1",
    "VLLM_LOGGING_COLOR": "0",
    "NO_COLOR": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # greedy decoding needs no top-k/top-p sampler; FlashInfer's is not part of the carried kit
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}
SEED = 0
# How the child builds vLLM's engine, recorded in every identity. Eager (no CUDA graphs, no
# compilation), Triton attention (pure Triton: no FlashAttention binaries need carrying), the
# tokenizer not loaded (token-id prompts; the synthetic parents' byte tokenizer is not one vLLM
# knows), one sequence at a time, and a fixed KV cache so that several processes can share a GPU
# without vLLM sizing its cache from memory the others are using.
LLM_SETTINGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "enforce_eager": True,
    "attention_backend": "TRITON_ATTN",
    "skip_tokenizer_init": True,
    "max_num_seqs": 1,
    "gpu_memory_utilization": 0.1,
    "kv_cache_memory_bytes": 1 << 30,
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SELECTION = re.compile(r"\b(?:Selected|Using) (?P<kernel>[A-Za-z0-9_]+ScaledMMLinearKernel) for "
                        r"(?P<module>[A-Za-z0-9_.]+)")


@dataclass(frozen=True)
class KernelSelection:
    """One kernel-selection log line: the kernel class vLLM chose and the layer scheme it chose it for."""

    kernel: str
    module: str


def requested_kernel(arm: str) -> str:
    """The vLLM kernel class an arm must run; InputError for an arm this backend does not serve."""
    if arm not in ARM_KERNELS:
        raise InputError(f"vLLM backend: arm {arm!r} is not a vLLM arm (expected {sorted(ARM_KERNELS)})")
    return ARM_KERNELS[arm][0]


def arm_environment(arm: str, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ``base`` with this arm's kernel switch and the fixed log settings.

    Any inherited ``VLLM_DISABLED_KERNELS`` is replaced, so the arm alone decides the kernel list.
    """
    requested_kernel(arm)
    env = {k: v for k, v in base.items() if k != DISABLE_VAR}
    env.update(CHILD_ENV)
    disabled = ARM_KERNELS[arm][1]
    if disabled is not None:
        env[DISABLE_VAR] = disabled
    return env


def runner_argv(request: Path, output: Path, python: str = sys.executable) -> list[str]:
    """The command that runs one arm in a fresh interpreter."""
    return [python, "-m", "int8alibi.engines.vllm_engine", "--request", str(request), "--output", str(output)]


def model_len(prompts: Sequence[Sequence[int]], new_tokens: int) -> int:
    """The context vLLM is built for: the longest prompt plus the generated tokens, no more."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("vLLM backend: every prompt needs at least one token")
    return max(len(p) for p in prompts) + int(new_tokens)


def request_payload(checkpoint_dir: Path, prompts: Sequence[Sequence[int]], new_tokens: int) -> dict[str, Any]:
    """What the child generates: token-id prompts, greedy, exactly ``new_tokens`` tokens each."""
    if new_tokens < 1:
        raise InputError(f"vLLM backend: new_tokens must be >= 1, got {new_tokens}")
    return {
        "checkpoint": str(Path(checkpoint_dir).resolve()),
        "prompts": [[int(t) for t in p] for p in prompts],
        "new_tokens": int(new_tokens),
        "llm": {**LLM_SETTINGS, "max_model_len": model_len(prompts, new_tokens), "seed": SEED},
    }


def environment_digest(distributions: Mapping[str, str], python: str) -> str:
    """SHA-256 of the Python version and every installed distribution's name and version: the stand-in
    for a container digest (two processes with equal digests ran the same installed software)."""
    lines = [f"python {python}", *sorted(f"{name.lower()}=={version}" for name, version in distributions.items())]
    return sha256_bytes("\n".join(lines).encode())


def installed_distributions() -> dict[str, str]:
    """``{name: version}`` of every distribution this interpreter can import from."""
    from importlib import metadata

    return {str(d.metadata["Name"]): str(d.version) for d in metadata.distributions() if d.metadata["Name"]}


def parse_selection(log_text: str) -> list[KernelSelection]:
    """Every scaled-mm kernel-selection line in a vLLM log, in order (colour codes ignored)."""
    return [KernelSelection(m["kernel"], m["module"]) for m in _SELECTION.finditer(_ANSI.sub("", log_text))]


def verify_selection(arm: str, selections: Sequence[KernelSelection], log: str) -> dict[str, Any]:
    """Kernel evidence for ``arm``, or InputError if vLLM did not select exactly the requested kernel.

    Refused: no selection line for the INT8 W8A8 scheme (nothing proves what ran), or any
    selection of another kernel class. ``log`` names the log file in the message.
    """
    wanted = requested_kernel(arm)
    int8 = [s for s in selections if s.module == INT8_SCHEME]
    if not int8:
        seen = ", ".join(f"{s.kernel} for {s.module}" for s in selections) or "none"
        raise InputError(f"{log}: vLLM logged no kernel selection for {INT8_SCHEME} (selections seen: "
                         f"{seen}); arm {arm} cannot be verified")
    wrong = [s for s in selections if s.kernel != wanted]
    if wrong:
        raise InputError(f"{log}: arm {arm} requested {wanted}, but vLLM selected {wrong[0].kernel} "
                         f"for {wrong[0].module}; refusing to record this run")
    return {
        "arm": arm,
        "engine": "vllm",
        "implementation": f"vLLM {wanted} (selected by vLLM, verified from its log)",
        "is_emulation": False,
        "requested_kernel": wanted,
        "selected": sorted({f"{s.kernel} for {s.module}" for s in selections}),
        "environment": {DISABLE_VAR: ARM_KERNELS[arm][1] or "unset"},
        "vllm": package_version("vllm"),
    }


_SELECTED = re.compile(r"[A-Za-z0-9_]+ScaledMMLinearKernel for [A-Za-z0-9_.]+")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def evidence_problem(arm: str, evidence: Mapping[str, Any], process: Mapping[str, Any]) -> str | None:
    """Why a recorded vLLM artifact's kernel evidence is not what ``verify_selection`` writes for
    ``arm`` (the requested kernel, only it selected, the switch that selects it, the log's digest),
    or None. An identity file edited or written by anything else is refused by the join."""
    if arm not in ARM_KERNELS:
        return f"arm {arm!r} is not a vLLM arm"
    wanted, disabled = ARM_KERNELS[arm]
    selected = evidence.get("selected")
    if evidence.get("requested_kernel") != wanted:
        return f"requested_kernel is {evidence.get('requested_kernel')!r}, arm {arm} runs {wanted}"
    if not isinstance(selected, list) or not selected or not all(
            isinstance(s, str) and _SELECTED.fullmatch(s) for s in selected):
        return f"selected is {selected!r}, not a non-empty list of '<Kernel> for <Scheme>' lines from vLLM's log"
    if any(s.split(" for ", 1)[0] != wanted for s in selected) or f"{wanted} for {INT8_SCHEME}" not in selected:
        return f"selected {selected!r} is not {wanted} for {INT8_SCHEME} alone"
    if evidence.get("environment") != {DISABLE_VAR: disabled or "unset"}:
        return f"environment is {evidence.get('environment')!r}, arm {arm} runs with {DISABLE_VAR}={disabled or 'unset'}"
    if not isinstance(process.get("log_sha256"), str) or not _HEX64.fullmatch(process["log_sha256"]):
        return f"the engine log's digest is {process.get('log_sha256')!r}, not a SHA-256"
    return None


def available() -> tuple[bool, str]:
    """Whether this machine can run the backend: vLLM installed and a CUDA GPU visible."""
    import torch

    if importlib.util.find_spec("vllm") is None:
        return False, "vLLM is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible to torch"
    return True, f"vLLM {package_version('vllm')} with a CUDA GPU"


@dataclass(frozen=True)
class VllmRun:
    """One arm's process: generated token ids per prompt, the verified kernel evidence, the settings
    vLLM was built with, the digest of the child's installed software and of its log."""

    tokens: list[list[int]]
    evidence: dict[str, Any]
    settings: dict[str, Any]
    environment_sha256: str
    log_sha256: str


def generate(arm: str, checkpoint_dir: Path, prompts: Sequence[Sequence[int]], new_tokens: int,
             work_dir: Path, *, timeout_s: float = 3600.0) -> VllmRun:
    """Run ``arm`` in a fresh process on the checkpoint; verify its kernel from the log; return tokens."""
    requested_kernel(arm)
    ok, why = available()
    if not ok:
        raise InputError(f"vLLM backend for arm {arm}: not available here ({why})")
    work_dir.mkdir(parents=True, exist_ok=True)
    request, output, log = (work_dir / f"{arm}.{suffix}" for suffix in ("request.json", "tokens.json", "vllm.log"))
    payload = request_payload(checkpoint_dir, prompts, new_tokens)
    request.write_text(json.dumps(payload))
    with open(log, "w", encoding="utf-8") as handle:
        try:
            done = subprocess.run(runner_argv(request, output), env=arm_environment(arm, os.environ),
                                  stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise InputError(f"{log}: vLLM arm {arm} did not finish within {timeout_s:.0f} s") from None
    text = log.read_text(encoding="utf-8", errors="replace")
    if done.returncode != 0:
        tail = "\n".join(text.splitlines()[-20:])
        raise InputError(f"{log}: vLLM arm {arm} exited with status {done.returncode}:\n{tail}")
    evidence = verify_selection(arm, parse_selection(text), str(log))
    result = json.loads(output.read_text())
    tokens = result["tokens"]
    if len(tokens) != len(prompts) or any(len(t) != new_tokens for t in tokens):
        raise InputError(f"{output}: expected {len(prompts)} sequences of {new_tokens} tokens from arm {arm}")
    request.unlink()  # the tokens go into the stage's table; the log stays as the kernel evidence
    output.unlink()
    return VllmRun(tokens=[[int(t) for t in seq] for seq in tokens], evidence=evidence, settings=payload["llm"],
                   environment_sha256=str(result["environment_sha256"]), log_sha256=sha256_bytes(log.read_bytes()))


def _child_main(argv: Sequence[str] | None = None) -> int:
    """In the fresh process: load the checkpoint in vLLM and decode each prompt greedily, alone."""
    parser = argparse.ArgumentParser(prog="int8alibi.engines.vllm_engine")
    parser.add_argument("--request", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)
    req = json.loads(args.request.read_text())

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=req["checkpoint"], **req["llm"])
    params = SamplingParams(temperature=0.0, max_tokens=req["new_tokens"], min_tokens=req["new_tokens"],
                            ignore_eos=True, detokenize=False)
    # One prompt per call: batch composition cannot influence a sequence.
    tokens = [list(llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0].outputs[0].token_ids)
              for p in req["prompts"]]
    env = environment_digest(installed_distributions(), sys.version.split()[0])
    args.output.write_text(json.dumps({"tokens": tokens, "environment_sha256": env}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main())
