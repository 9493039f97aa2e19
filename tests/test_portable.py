"""Portable CPU bytes: the settings, their checks, and the proof that steering the CPU moves no byte.

The end-to-end test runs the byte-producing stages that follow requant (capture, prediction,
compare, faults, generate, perplexity, tokens, prefill_decode) of the tiny model in fresh processes
under every instruction set the host supports, capped oneDNN and MKL instruction sets, and 1 or 2
threads, and requires identical digests; with the mechanism switched off the same steering must
show up in the bytes and in ``int8alibi diff``, so the test can tell the mechanism from luck.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from int8alibi import portable
from int8alibi.errors import InputError
from int8alibi.model.portable import PortableLinear, make_portable
from int8alibi.model.synthetic import build_synthetic
from int8alibi.provenance.audit import diff

ARMS = ["exact-cutlass-order", "exact-triton-order"]


@pytest.fixture(scope="module", autouse=True)
def _mkl_started_under_the_pins() -> None:
    """MKL reads MKL_CBWR once, at its first call: make that call under the suite's pins, before a
    test here changes the variable and asks MKL for its facts."""
    torch.ones(2, 2) @ torch.ones(2, 2)


# ------------------------------------------------------------------ settings and checks


def test_apply_to_environ_sets_the_pins_unless_switched_off() -> None:
    env: dict[str, str] = {}
    portable.apply_to_environ(env)
    assert env == dict(portable.PINNED_ENV)
    off = {portable.SWITCH: "0"}
    portable.apply_to_environ(off)
    assert off == {portable.SWITCH: "0"}


def test_the_suite_itself_runs_under_the_pins() -> None:
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"


def test_check_process_names_every_setting_that_did_not_take_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(InputError) as err:
        portable.check_process(pinned=True)
    message = str(err.value)
    for expected in ("MKL_CBWR is 'AUTO'", "AVX512 CPU kernels", "oneDNN is enabled", "2 intra-op threads"):
        assert expected in message
    monkeypatch.setenv(portable.SWITCH, "0")
    portable.check_process(pinned=True)  # switched off: nothing is required (and facts say so)
    assert portable.facts()["portable"] is False


def test_threads_are_only_pinned_for_pinned_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    portable.check_process(pinned=False)
    with pytest.raises(InputError, match="intra-op threads"):
        portable.check_process(pinned=True)


def test_the_pins_are_atens_baseline_and_mkls_compatible_branch() -> None:
    env: dict[str, str] = {"ATEN_CPU_CAPABILITY": "avx2"}  # an inherited wrong pin is overwritten
    portable.apply_to_environ(env)
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE"
    assert portable.FORWARD_THREADS == 1


def test_check_process_names_an_inherited_wrong_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    with pytest.raises(InputError, match="ATEN_CPU_CAPABILITY is 'avx2', not 'default'"):
        portable.check_process(pinned=False)


# ------------------------------------------------------------------ re-executing a stage started by hand


class _Exec(Exception):
    """Raised by the fake execve so the test sees what would have been executed."""


def _capture_exec(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], dict[str, str]]]:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_execve(path: str, args: list[str], env: dict[str, str]) -> None:
        calls.append((path, list(args), dict(env)))
        raise _Exec

    monkeypatch.setattr(os, "execve", fake_execve)
    return calls


@pytest.mark.parametrize("inherited", [{}, {"ATEN_CPU_CAPABILITY": "avx512"}, {"MKL_CBWR": "AUTO"},
                                       {"ATEN_CPU_CAPABILITY": "default"}])
def test_a_process_without_the_pins_re_executes_itself_with_them(monkeypatch: pytest.MonkeyPatch,
                                                                 inherited: dict[str, str]) -> None:
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "INT8ALIBI_PORTABLE_REEXEC", "PORTABLE_CPU"):
        monkeypatch.delenv(name, raising=False)
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    calls = _capture_exec(monkeypatch)
    with pytest.raises(_Exec):
        portable.ensure_process("int8alibi.stages.capture", ["--config", "c.yaml", "--out", "o"])
    (path, args, env), = calls
    assert path == sys.executable
    assert args == [sys.executable, "-m", "int8alibi.stages.capture", "--config", "c.yaml", "--out", "o"]
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE"
    assert env["INT8ALIBI_PORTABLE_REEXEC"] == "1"
    assert env["PATH"] == os.environ["PATH"]  # the rest of the environment is inherited


@pytest.mark.parametrize("environ", [
    {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},                   # already in force
    {"PORTABLE_CPU": "0"},                                                          # switched off
    {"ATEN_CPU_CAPABILITY": "avx2", "INT8ALIBI_PORTABLE_REEXEC": "1"},              # once only
])
def test_no_re_execution_when_pinned_switched_off_or_already_re_executed(monkeypatch: pytest.MonkeyPatch,
                                                                        environ: dict[str, str]) -> None:
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "INT8ALIBI_PORTABLE_REEXEC", "PORTABLE_CPU"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    calls = _capture_exec(monkeypatch)
    portable.ensure_process("int8alibi.stages.capture", [])
    assert calls == []


def test_only_zero_switches_the_mechanism_off() -> None:
    assert portable.enabled({}) and portable.enabled({"PORTABLE_CPU": "1"}) and portable.enabled({"PORTABLE_CPU": ""})
    assert not portable.enabled({"PORTABLE_CPU": "0"})


# ------------------------------------------------------------------ facts, as the libraries see them

HASWELL = {"avx2": True, "fma3": True}  # what torch's probes report under an emulated Haswell
SKYLAKE_X = {**HASWELL, "avx512_f": True, "avx512_vl": True, "avx512_bw": True, "avx512_dq": True}


@pytest.mark.parametrize(("features", "expected"), [
    ({}, "DEFAULT"),
    ({"avx2": True}, "DEFAULT"),                         # ATen's AVX2 kernels also need FMA
    ({"fma3": True}, "DEFAULT"),
    (HASWELL, "AVX2"),
    ({**SKYLAKE_X, "avx512_dq": False}, "AVX2"),         # AVX-512 without DQ
    ({**SKYLAKE_X, "avx512_bw": False}, "AVX2"),
    ({**SKYLAKE_X, "avx512_vl": False}, "AVX2"),
    ({**SKYLAKE_X, "fma3": False}, "DEFAULT"),           # no FMA: neither vector capability
    (SKYLAKE_X, "AVX512"),
    ("not reported by torch 2.11", "not reported by torch 2.11"),  # no probes: says why, guesses nothing
])
def test_detected_capability_follows_atens_rule(features: dict[str, bool] | str, expected: str) -> None:
    assert portable.detected_capability(features) == expected


def _fake_probes(monkeypatch: pytest.MonkeyPatch, found: dict[str, object]) -> None:
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "x86_64", **found}, raising=False)


def test_the_manifest_records_the_librarys_capability_where_proc_cpuinfo_disagrees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/cpuinfo shows AVX-512 (a container or emulator passes the host's through), torch's probes do not."""
    host_flags = ["avx2", "avx512bw", "avx512dq", "avx512f", "avx512vl", "fma"]
    monkeypatch.setattr(portable, "_cpu_info", lambda: ("Host CPU", host_flags))
    _fake_probes(monkeypatch, {**HASWELL, "sha": True})
    facts = portable.facts()
    assert facts["cpu_capability_detected"] == "AVX2"
    assert facts["cpu_features"]["avx2"] is True and facts["cpu_features"]["avx512_f"] is False
    assert set(facts["cpu_features"]) == set(portable.TORCH_FEATURES)  # only the probes that act, all of them
    # The host's view is still there, labelled as such.
    assert facts["cpu_model"] == "Host CPU"
    assert facts["cpu_flags_sha256"] == hashlib.sha256(b"avx2 avx512bw avx512dq avx512f avx512vl fma").hexdigest()
    assert "/proc/cpuinfo" in facts["sources"]["cpu_model"] and "/proc/cpuinfo" in facts["sources"]["cpu_flags_sha256"]
    # ... and the other way round: the probes, not the host's flags, decide.
    monkeypatch.setattr(portable, "_cpu_info", lambda: ("Host CPU", ["sse2"]))
    _fake_probes(monkeypatch, {**SKYLAKE_X, "amx_tile": True})
    facts = portable.facts()
    assert facts["cpu_capability_detected"] == "AVX512" and facts["cpu_features"]["amx_tile"] is True


def test_without_torchs_probes_the_facts_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    facts = portable.facts()
    assert facts["cpu_features"].startswith("not reported by torch") and "get_capabilities" in facts["cpu_features"]
    assert facts["cpu_capability_detected"] == facts["cpu_features"]
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "arm64", "neon": True}, raising=False)
    assert portable.torch_cpu_features() == "n/a (arm64 CPU)"


@pytest.mark.parametrize(("code", "name"), [
    (1, "BRANCH_OFF"), (2, "AUTO"), (3, "COMPATIBLE"), (10, "AVX2"), (12, "AVX512"), (14, "AVX512_E1"),
    (10 | 0x10000, "AVX2,STRICT"), (15, "code 15"), (0, "OFF"), (4, "SSE2"), (5, "SSE3"), (6, "SSSE3"),
    (7, "SSE4_1"), (8, "SSE4_2"), (9, "AVX"), (11, "AVX512_MIC"), (13, "AVX512_MIC_E1"),
    (3 | 0x10000, "COMPATIBLE,STRICT"),
])
def test_mkl_branch_codes_are_named_as_mkl_cbwr_spells_them(code: int, name: str) -> None:
    assert portable.mkl_branch_name(code) == name


def test_mkl_reports_the_branch_in_force_not_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """MKL's own report: the suite's MKL started under MKL_CBWR=COMPATIBLE, and a variable changed
    since (MKL reads it once) is recorded as steering, not as MKL's branch."""
    mkl = portable.mkl_facts()
    if isinstance(mkl, str):
        pytest.skip(f"not applicable: MKL gives no report in this torch build: {mkl}")
    assert mkl["branch"] == "COMPATIBLE"
    assert "Math Kernel Library" in mkl["version"]
    assert mkl["auto_branch"] in portable.MKL_BRANCHES.values()
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    facts = portable.facts()
    assert facts["mkl"]["branch"] == "COMPATIBLE" and facts["steering"]["MKL_CBWR"] == "AUTO"


def test_facts_record_what_could_move_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = portable.facts()
    assert facts["portable"] is True and facts["cpu_capability_effective"] == "DEFAULT"
    assert len(facts["cpu_flags_sha256"]) == 64 and facts["cpu_model"]
    assert facts["steering"]["ATEN_CPU_CAPABILITY"] == "default"
    # Every variable that steers ATen, MKL, oneDNN or the thread pools is recorded, with its value.
    steering = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC", "KMP_AFFINITY", "PORTABLE_CPU")
    for i, name in enumerate(steering):
        monkeypatch.setenv(name, f"value-{i}")
    recorded = portable.facts()["steering"]
    assert {name: recorded.get(name) for name in steering} == {name: f"value-{i}" for i, name in enumerate(steering)}
    monkeypatch.delenv("MKL_DYNAMIC")
    assert portable.facts()["steering"]["MKL_DYNAMIC"] == "unset"


X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Example CPU @ 2.00GHz
flags\t\t: fma sse2 avx2 avx512f
bugs\t\t: spectre_v1

processor\t: 1
model name\t: Second CPU
flags\t\t: sse2
"""
ARM_CPUINFO = "Processor\t: AArch64 Processor rev 1\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\n"


def test_proc_cpuinfo_is_read_for_the_first_processors_model_and_flags() -> None:
    assert portable.parse_cpuinfo(X86_CPUINFO) == ("Example CPU @ 2.00GHz", ["avx2", "avx512f", "fma", "sse2"])
    assert portable.parse_cpuinfo(ARM_CPUINFO) == ("AArch64 Processor rev 1", ["asimd", "evtstrm", "fp"])
    assert portable.parse_cpuinfo("cpu model\t\t: Loongson-3A\n") == ("Loongson-3A", [])
    assert portable.parse_cpuinfo("") == ("unknown", [])


def test_the_torch_probes_recorded_are_the_ones_the_cpu_paths_act_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX2/FMA and the AVX-512 subsets ATen's rule reads, VNNI/bf16/fp16, and AMX's tiles, int8, bf16, fp16."""
    wanted = {"avx2", "fma3", "avx512_f", "avx512_vl", "avx512_bw", "avx512_dq", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16"}
    every = {name: True for name in wanted}
    _fake_probes(monkeypatch, {**every, "sse4_2": True, "avx512_ifma": True})
    assert portable.torch_cpu_features() == every


def test_a_probe_torch_does_not_report_is_recorded_as_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_probes(monkeypatch, {"avx2": True})
    features = portable.torch_cpu_features()
    assert features["avx2"] is True and not any(v for k, v in features.items() if k != "avx2")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "x86", "avx2": True}, raising=False)
    assert portable.torch_cpu_features()["avx2"] is True          # 32-bit x86 is probed the same way


def test_without_proc_cpuinfo_the_platform_names_the_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    def no_file(*args: object, **kwargs: object) -> None:
        raise OSError("no /proc here")

    monkeypatch.setattr(portable, "open", no_file, raising=False)
    monkeypatch.setattr(platform, "processor", lambda: "arm")
    assert portable._cpu_info() == ("arm", [])
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert portable._cpu_info() == ("unknown", [])


def test_every_library_and_host_fact_names_its_source() -> None:
    facts = portable.facts()
    for name in ("cpu_model", "cpu_flags_sha256", "cpu_features", "cpu_capability_detected",
                 "cpu_capability_effective", "mkl"):
        assert name in facts and facts["sources"][name], name
    assert "/proc/cpuinfo" not in " ".join(facts["sources"][n] for n in ("cpu_features", "cpu_capability_detected"))


def test_the_c_library_is_named_or_said_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert portable.facts()["libc"] == "glibc 2.36"
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert portable.facts()["libc"] == "unknown"


def test_two_portable_hosts_with_other_probes_still_join() -> None:
    """Host-only facts (probes, MKL's own pick) may differ between portable artifacts; the effective ones not."""
    from int8alibi.engines.identity import HOST_FIELDS

    for field in ("cpu.cpu_features.avx512_f", "cpu.cpu_features", "cpu.mkl.auto_branch", "cpu.cpu_model"):
        assert field.startswith(HOST_FIELDS)
    for field in ("cpu.mkl.branch", "cpu.cpu_capability_effective", "cpu.mkldnn_enabled", "cpu.intra_op_threads"):
        assert not field.startswith(HOST_FIELDS)


@pytest.mark.slow
def test_under_an_emulated_haswell_the_facts_say_avx2(tmp_path: Path) -> None:
    """qemu-user's Haswell model has no AVX-512, while /proc/cpuinfo still shows this host's flags."""
    import shutil

    qemu = shutil.which("qemu-x86_64")
    if qemu is None or not portable.torch_cpu_features() or portable.facts()["cpu_capability_detected"] != "AVX512":
        pytest.skip("not applicable: needs qemu-x86_64 (Debian's qemu-user) on an AVX-512 host")
    script = ("import json; from int8alibi import portable; f = portable.facts(); "
              "print(json.dumps([f['cpu_capability_detected'], f['mkl'], f['cpu_flags_sha256']]))")
    env = _env({})
    done = subprocess.run([qemu, "-cpu", "Haswell", sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    detected, mkl, flags_digest = json.loads(done.stdout.strip().splitlines()[-1])
    assert detected == "AVX2"
    if isinstance(mkl, dict):
        assert mkl["auto_branch"] == "AVX2"
    assert flags_digest == portable.facts()["cpu_flags_sha256"]  # the host's flags, labelled as such


# ------------------------------------------------------------------ the model's float linears


def _bf16(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.bfloat16)


def test_portable_linear_rounds_the_exact_sum_once_to_nearest_even() -> None:
    """Rows chosen so the float32 sum is exact and lands on or beside a bf16 tie."""
    layer = PortableLinear(3, 1, bias=False).to(torch.bfloat16)
    layer.weight.data = _bf16([[1.0, 1.0, 1.0]][0]).reshape(1, 3)
    x = torch.stack([
        _bf16([1.0, 2.0**-8, 0.0]),             # 1 + 2^-8: a tie, to even -> 1
        _bf16([1.0, 2.0**-8, 2.0**-20]),        # just above the tie -> 1 + 2^-7
        _bf16([1.0, 3 * 2.0**-8, 0.0]),         # 1 + 3*2^-8: a tie, to even -> 1 + 2^-6
        _bf16([-1.0, -(2.0**-8), 0.0]),         # the negative tie -> -1
        _bf16([1.0, -1.0, 0.0]),                # exact cancellation -> +0
        _bf16([2.0**-130, 2.0**-130, 0.0]),     # subnormal sum stays subnormal, exact
        _bf16([3.0e38, 3.0e38, 0.0]),           # float32 overflow -> +inf
    ])
    y = layer(x).float().flatten().tolist()
    assert y[:5] == [1.0, 1.0 + 2.0**-7, 1.0 + 2.0**-6, -1.0, 0.0]
    assert y[5] == 2.0**-129 and y[6] == float("inf")
    assert torch.signbit(layer(x)[4]).item() is False


def test_portable_linear_matches_a_float64_reference_on_random_data() -> None:
    gen = torch.Generator().manual_seed(7)
    layer = PortableLinear(64, 48).to(torch.bfloat16)
    layer.weight.data = torch.randn(48, 64, generator=gen).to(torch.bfloat16)
    layer.bias.data = torch.randn(48, generator=gen).to(torch.bfloat16)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    ref = (x.double() @ layer.weight.double().T + layer.bias.double()).to(torch.bfloat16)
    out = layer(x)
    # float32 accumulation of 64 exact products may differ from the float64 sum by one rounding.
    assert (out.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2.0**-7
    assert torch.equal(layer(x).view(torch.int16), out.view(torch.int16))  # the cached weight is reused
    layer.weight.data = layer.weight.data * 2
    assert not torch.equal(layer(x), out)  # a replaced weight is seen


def test_make_portable_keeps_parameters_and_switches_attention() -> None:
    model = build_synthetic("tiny", 0, vocab_size=512)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    make_portable(model)
    assert model.config._attn_implementation == "eager"
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


# ------------------------------------------------------------------ steering the CPU moves no byte


def _host_capabilities() -> list[str]:
    order = ["default", "avx2", "avx512"]
    best = portable.detected_capability(portable.torch_cpu_features()).lower()
    return order[: order.index(best) + 1] if best in order else ["default"]


def _variants() -> list[dict[str, str]]:
    """Every capability the host supports, crossed over thread counts and capped library ISAs."""
    caps = _host_capabilities()
    out = [{"ATEN_CPU_CAPABILITY": cap, "OMP_NUM_THREADS": str(1 + i % 2)} for i, cap in enumerate(caps)]
    out.append({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "2"})
    out.append({"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"})
    return out


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in portable.PINNED_ENV and k not in portable.STEERING_VARS and k != portable._REEXEC_MARK}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "workflow")
    env.update(extra)
    return env


def _stage(stage: str, cfg: Path, out: Path, env: dict[str, str], *args: str) -> None:
    cmd = [sys.executable, "-m", f"int8alibi.stages.{stage}", "--config", str(cfg), "--out", str(out), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{stage} under {env.get('ATEN_CPU_CAPABILITY')}: {done.stderr[-2000:]}"


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.suffix in (".parquet", ".safetensors")}


def _run_model_stages(cfg: Path, results: Path, out: Path, env: dict[str, str], stages: tuple[str, ...]) -> None:
    gate = f"gate={results}/requant/gate.parquet"
    if "capture" in stages:
        _stage("capture", cfg, out / "capture", env, "--input", gate)
        _stage("prediction", cfg, out / "prediction", env, "--input", f"index={out}/capture/index.parquet")
        # The exact-arithmetic stages downstream, which keep their threads: bytes must not move either.
        _stage("compare", cfg, out / "compare", env, "--set", "exploratory=true", "--input",
               f"index={out}/capture/index.parquet", "--input", f"predictions={out}/prediction/predictions.parquet")
        _stage("faults", cfg, out / "faults", env, "--input", f"operands={out}/capture/index.parquet")
    if "generate" in stages:
        _stage("generate", cfg, out / "generate", env, "--input", gate, "--param", f"arm={ARMS[0]}",
               "--param", "checkpoint=own", "--param", "run=1")
    if "perplexity" in stages:
        _stage("perplexity", cfg, out / "perplexity", env, "--input", gate)
    if "tokens" in stages:
        _stage("tokens", cfg, out / "tokens", env, "--input", gate, "--input", f"parent={results}/model/parent.parquet")
    if "prefill_decode" in stages:
        _stage("prefill_decode", cfg, out / "prefill_decode", env, "--input", gate)


@pytest.fixture(scope="module")
def tiny(tiny_pipeline) -> tuple[Path, Path]:
    path, cfg = tiny_pipeline("portable", ARMS)
    return path, cfg.results


@pytest.mark.slow
def test_steering_the_cpu_moves_no_byte_of_any_model_stage(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    cfg, results = tiny
    stages = ("capture", "generate", "perplexity", "tokens", "prefill_decode")
    variants = _variants()

    def digests_under(i: int) -> dict[str, str]:
        out = tmp_path / f"v{i}"
        _run_model_stages(cfg, results, out, _env(variants[i]), stages)
        return _digests(out)

    # two variants at a time: each is a chain of fresh processes, mostly single-threaded start-up
    with ThreadPoolExecutor(max_workers=2) as pool:
        seen = dict(zip(map(repr, variants), pool.map(digests_under, range(len(variants)))))
    reference = next(iter(seen.values()))
    for table in ("capture/index.parquet", "prediction/predictions.parquet", "compare/layers.parquet",
                  "faults/cells.parquet", "generate/tokens.parquet",
                  "perplexity/windows.parquet", "tokens/positions.parquet", "tokens/check7.parquet",
                  "prefill_decode/prefill_decode.parquet", "prefill_decode/first_divergence.parquet"):
        assert table in reference
    assert any(name.startswith("capture/operands/") for name in reference)
    for variant, digests in seen.items():
        assert digests == reference, f"bytes moved under {variant}"


@pytest.mark.slow
def test_without_the_mechanism_the_capability_shows_in_bytes_and_in_diff(tiny: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    """The same steering with PORTABLE_CPU=0: capture bytes follow the capability, and diff names it."""
    cfg, results = tiny
    caps = _host_capabilities()
    if len(caps) < 2:
        pytest.skip(f"this CPU offers only {caps}: no second capability to compare")
    runs = {}
    for cap in (caps[0], caps[-1]):
        out = tmp_path / cap
        _run_model_stages(cfg, results, out, _env({portable.SWITCH: "0", "ATEN_CPU_CAPABILITY": cap}), ("perplexity",))
        runs[cap] = out
    differences = diff(runs[caps[0]], runs[caps[-1]])
    fields = {d.field for d in differences}
    assert "environment.cpu.cpu_capability_effective" in fields
    assert "environment.cpu.steering.ATEN_CPU_CAPABILITY" in fields
    assert _digests(runs[caps[0]]) != _digests(runs[caps[-1]]), "perplexity bytes did not depend on the capability"
