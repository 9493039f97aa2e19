"""``int8alibi <command>``: lazy dispatch, clear errors for missing commands, the console script."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from int8alibi import cli
from int8alibi.errors import InputError


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """A stand-in command module whose functions record the argv they receive."""
    calls: list[tuple[str, list[str]]] = []
    module = types.ModuleType("int8alibi_test_commands")

    def make(name: str, code: int):
        def entry(argv: list[str]) -> int:
            calls.append((name, argv))
            return code
        return entry

    module.bench = make("bench", 0)
    module.kernels = make("kernels", 0)
    module.failing = make("failing", 1)

    def raising(argv: list[str]) -> int:
        raise InputError("config.yaml: no such model")

    module.raising = raising
    from int8alibi.tools import bench

    monkeypatch.setitem(cli.COMMANDS, "diff", (lambda: module.bench, "diff"))
    monkeypatch.setitem(bench.BENCHMARKS, "kernels", lambda: module.kernels)
    monkeypatch.setitem(cli.COMMANDS, "conform", (lambda: module.failing, "conformance"))
    monkeypatch.setitem(cli.COMMANDS, "amend", (lambda: module.raising, "amend"))
    return calls


def test_dispatch_passes_the_remaining_arguments(recorder: list[tuple[str, list[str]]]) -> None:
    assert cli.main(["diff", "--quick"]) == 0
    assert cli.main(["bench", "kernels", "--m", "512"]) == 0  # bench dispatches its own names
    assert cli.main(["conform", "x"]) == 1
    assert recorder == [("bench", ["--quick"]), ("kernels", ["--m", "512"]), ("failing", ["x"])]


def test_command_error_is_one_line_not_a_traceback(recorder: list, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["amend"]) == 1
    assert capsys.readouterr().err == "int8alibi amend: config.yaml: no such model\n"


def _missing_module():
    import int8alibi.no_such_module  # type: ignore[import-not-found]  # noqa: F401


def _missing_function():
    from int8alibi.errors import no_such_function  # type: ignore[attr-defined]

    return no_such_function


@pytest.mark.parametrize(("loader", "message"), [
    (_missing_module, "its module cannot be imported (No module named 'int8alibi.no_such_module')"),
    (_missing_function, "its module cannot be imported (cannot import name 'no_such_function' from 'int8alibi.errors'"),
])
def test_missing_command_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                 loader, message: str) -> None:
    monkeypatch.setitem(cli.COMMANDS, "conform", (loader, "conformance"))
    assert cli.main(["conform"]) == cli.UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("int8alibi conform: not available: ") and message in err
    assert "Traceback" not in err


def test_a_benchmark_whose_module_is_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from int8alibi.tools import bench

    monkeypatch.setitem(bench.BENCHMARKS, "kernels", _missing_module)
    assert cli.main(["bench", "kernels"]) == 2
    err = capsys.readouterr().err
    assert err == ("int8alibi bench kernels: not available: its module cannot be imported "
                   "(No module named 'int8alibi.no_such_module')\n")


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_verify_dispatches_to_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", str(tmp_path / "nowhere")]) == 1
    assert "does not exist" in capsys.readouterr().out


def test_console_script_verify_help() -> None:
    script = Path(sys.executable).with_name("int8alibi")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    done = subprocess.run([str(script), "verify", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: int8alibi verify")
    assert "--json" in done.stdout


def test_bench_help_lists_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    from int8alibi.tools import bench

    for flag in ("--help", "-h"):
        assert cli.main(["bench", flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: int8alibi bench") and all(f"  {name} " in out for name in bench.BENCHMARKS)
    assert set(bench.ABOUT) == set(bench.BENCHMARKS)
    assert cli.main(["bench", "nope"]) == 2  # an unknown benchmark is still a usage error
    assert "expected one of kernels, faults, dag, plan, decode, seeded, got 'nope'" in capsys.readouterr().err


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"int8alibi {metadata.version('int8alibi')}\n"


def test_a_stage_help_names_its_command_and_describes_every_option() -> None:
    done = subprocess.run([sys.executable, "-m", "int8alibi.stages.requant", "--help"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert out.startswith("usage: python -m int8alibi.stages.requant")
    assert "Stage `requant`" in out or "requant" in out.split("options:")[0]
    for flag, words in [("--config", "the run config"), ("--out", "the stage's folder"),
                        ("--input", "upstream"), ("--param", "named parameter"), ("--set", "override")]:
        assert f"{flag} " in out and words in out, (flag, out)
    assert "names this stage reads: parent (optional), checkpoint (optional), reference (optional)" in out
