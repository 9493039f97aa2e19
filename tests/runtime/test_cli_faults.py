"""What the machine refuses a command or a stage ends in one line naming the file and the reason and a
non-zero exit, never a traceback, and a stage's previous outputs are kept: a very long path, an ``--out``
that is a file, an absurd size (memory), output piped into ``head`` (the command still finishes its
files), EIO on a rename or an fsync, a file-size limit (``RLIMIT_FSIZE``: EFBIG, in a subprocess).
A bug is not the machine's refusal: it keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from int8alibi import cli
from int8alibi.errors import fault_line
from int8alibi.files.atomic import write_bytes
from int8alibi.runtime.runner import stage_main

from .test_runner_transaction import config, tree

ROOT = Path(__file__).resolve().parents[2]
LONG = "/".join(["d" * 200] * 25)  # past PATH_MAX (4096): the OS refuses it before looking at any part


def previous(out: Path) -> dict[str, str]:
    out.mkdir(parents=True)
    (out / "table.parquet").write_bytes(b"good table")
    (out / "manifest.json").write_text('{"good": true}')
    return tree(out)


def writes_table(cfg: object, out_dir: Path) -> None:
    """A stage that replaces its table and its manifest, as every stage does."""
    write_bytes(out_dir / "table.parquet", b"new table" * 1000)
    write_bytes(out_dir / "manifest.json", b'{"new": true}')


def command(monkeypatch: pytest.MonkeyPatch, body: Callable[[list[str]], int]) -> None:
    """Plant ``body`` as the command ``int8alibi diff``."""
    monkeypatch.setitem(cli.COMMANDS, "diff", (lambda: body, "a planted command"))


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def failing(exc: BaseException) -> Callable[[list[str]], int]:
    def body(argv: list[str]) -> int:
        raise exc
    return body


def eio(*files: str) -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO), *files[:1], *([None, files[1]] if len(files) > 1 else []))


# --- the line ---


@pytest.mark.parametrize("exc, line", [
    (FileExistsError(errno.EEXIST, "File exists", "/r/conform"), "/r/conform: File exists (EEXIST)"),
    (eio("/r/.t.tmp", "/r/t"), "/r/.t.tmp -> /r/t: Input/output error (EIO)"),
    (eio(), "Input/output error (EIO); the OS named no file (the stage writes into /r)"),
    (OSError(errno.EFBIG, "File too large"), "File too large (EFBIG); the OS named no file (the stage writes into /r)"),
    (OSError("[Errno 27] Error writing bytes to file"), "[Errno 27] Error writing bytes to file; the OS named no file "
                                                        "(the stage writes into /r)"),  # pyarrow keeps only a message
    (MemoryError(), "out of memory: MemoryError"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 8 bytes."), "out of memory: DefaultCPUAllocator: can't allocate memory: you "
                                                 "tried to allocate 8 bytes."),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore"), "out of memory: CUDA out of memory. "
                                                                          "Tried to allocate 2.00 GiB"),
    (RuntimeError("a bug"), None),
    (ValueError("a bug"), None),
])
def test_the_machine_s_refusals_are_one_line_and_bugs_are_none(exc: BaseException, line: str | None) -> None:
    assert fault_line(exc, "the stage writes into /r") == line


def test_a_very_long_file_name_is_shortened_in_the_middle_saying_so() -> None:
    name = "/r/" + "a" * 5000
    line = fault_line(OSError(errno.ENAMETOOLONG, "File name too long", name))
    assert line == f"/r/{'a' * 157}...{'a' * 160} (5003 characters): File name too long (ENAMETOOLONG)"


# --- commands (int8alibi <command>) ---


def test_a_very_long_path_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    command(monkeypatch, lambda argv: Path(argv[0]).mkdir(parents=True) or 0)
    assert cli.main(["diff", str(tmp_path / LONG)]) == cli.FAILED
    line = one_line(capsys)
    assert line.startswith(f"int8alibi diff: {tmp_path}/ddd") and line.endswith(" characters): File name too long "
                                                                                 "(ENAMETOOLONG)"), line
    assert len(line) < 500


def test_an_out_that_is_a_file_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    (tmp_path / "out").write_text("kept")
    command(monkeypatch, lambda argv: Path(argv[1]).mkdir(parents=True, exist_ok=True) or 0)
    assert cli.main(["diff", "--out", str(tmp_path / "out")]) == cli.FAILED
    assert one_line(capsys) == f"int8alibi diff: {tmp_path / 'out'}: File exists (EEXIST)"
    assert (tmp_path / "out").read_text() == "kept"


def test_an_absurd_size_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    command(monkeypatch, lambda argv: torch.empty(int(argv[1]), dtype=torch.int8) is None)  # what --m 10**15 asks
    assert cli.main(["diff", "--m", str(10**15)]) == cli.FAILED
    line = one_line(capsys)
    assert line.startswith("int8alibi diff: out of memory: DefaultCPUAllocator: can't allocate memory: you tried to "
                           "allocate 1000000000000000 bytes"), line


def test_eio_without_a_file_names_where_the_command_writes(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = previous(out)

    def body(argv: list[str]) -> int:
        writes_table(None, Path(argv[1]))
        return 0

    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(eio()))  # what a failing disk gives
    command(monkeypatch, body)
    assert cli.main(["diff", "--out", str(out)]) == cli.FAILED
    assert one_line(capsys) == (f"int8alibi diff: Input/output error (EIO); the OS named no file (the command writes "
                                f"into {out})")
    assert tree(out) == before  # atomic writes: the previous file stays, no temporary is left


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    command(monkeypatch, failing(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["diff"])


def _closed_pipe(monkeypatch: pytest.MonkeyPatch, stream: str) -> int:
    """``sys.<stream>`` becomes a pipe whose reader has gone (``| head`` after its first lines)."""
    read, write = os.pipe()
    os.close(read)
    handle = open(write, "w", buffering=1)
    monkeypatch.setattr(sys, stream, handle)
    return write


def test_output_into_a_closed_pipe_is_one_line_and_the_command_finishes_its_files(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"

    def body(argv: list[str]) -> int:
        for i in range(10_000):
            print(f"setting {i}: bitwise identical")
        writes_table(None, out)
        print("done")
        return 0

    command(monkeypatch, body)
    _closed_pipe(monkeypatch, "stdout")
    assert cli.main(["diff"]) == cli.FAILED
    err = capfd.readouterr().err.splitlines()
    assert err == ["int8alibi diff: standard output: its reader closed the pipe before the output ended (EPIPE); "
                   "the command ran to its end, its files are whole"]
    assert (out / "table.parquet").read_bytes() == b"new table" * 1000 and (out / "manifest.json").is_file()


def test_with_both_streams_closed_the_exit_status_still_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def body(argv: list[str]) -> int:
        print("x" * 100_000)
        print("y" * 100_000, file=sys.stderr)
        return 0

    command(monkeypatch, body)
    _closed_pipe(monkeypatch, "stdout")
    _closed_pipe(monkeypatch, "stderr")
    assert cli.main(["diff"]) == cli.FAILED


# --- stages (python -m int8alibi.stages.<stage>) ---


def test_a_stage_whose_out_path_is_too_long_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    assert stage_main(writes_table, ["--config", str(config(tmp_path)), "--out", str(tmp_path / LONG)]) == 1
    line = one_line(capsys)
    assert line.startswith(f"int8alibi: stage test_cli_faults failed: {tmp_path}/ddd") and line.endswith(
        " characters): File name too long (ENAMETOOLONG)"), line


@pytest.mark.parametrize("fails", ["rename", "fsync"])
def test_eio_in_a_stage_is_one_line_and_keeps_the_previous_outputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fails: str) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "results" / "stage"
    before = previous(out)
    replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        if Path(dst).name == "manifest.json" and str(src).endswith(".tmp"):  # the table is already replaced
            raise eio(str(src), str(dst))
        replace(src, dst)

    if fails == "rename":
        monkeypatch.setattr(os, "replace", failing_replace)
    else:
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(eio()))
    assert stage_main(writes_table, ["--config", str(config(tmp_path)), "--out", str(out)]) == 1
    line = one_line(capsys)
    assert line.startswith("int8alibi: stage test_cli_faults failed: ") and "Input/output error (EIO)" in line
    if fails == "rename":
        assert line.endswith(f"{out}/manifest.json: Input/output error (EIO)") and f" -> {out}/manifest.json" in line
    else:
        assert line.endswith(f"the OS named no file (the stage writes into {out})")
    assert tree(out) == before


SIZE_LIMITED = textwrap.dedent("""
    import resource, sys
    sys.path[:0] = [{root!r}, {root!r} + "/workflow"]  # this checkout's package, as conftest.py has it
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # ulimit -f: a write past it is EFBIG (SIGXFSZ ignored)
    from tests.runtime.test_cli_faults import writes_table
    from int8alibi.runtime.runner import stage_main
    raise SystemExit(stage_main(writes_table, sys.argv[1:]))
""")


def test_a_file_size_limit_in_a_stage_is_one_line_and_keeps_the_previous_outputs(tmp_path: Path) -> None:
    out = tmp_path / "results" / "stage"
    before = previous(out)
    script = SIZE_LIMITED.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script, "--config", str(config(tmp_path)), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    err = [line for line in done.stderr.splitlines() if " INFO " not in line and " WARNING " not in line]
    assert err == [f"int8alibi: stage test_cli_faults failed: File too large (EFBIG); the OS named no file (the stage writes "
                   f"into {out})"], done.stderr
    assert tree(out) == before
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] != 4096  # the limit was the subprocess's own


def test_the_conform_command_with_an_out_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """End to end, through the console script: the case that was a FileExistsError traceback."""
    script = Path(sys.executable).with_name("int8alibi")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    (tmp_path / "out").write_text("kept")
    done = subprocess.run([str(script), "conform", "--arm-a", "exact-cutlass-order", "--arm-b", "exact-triton-order",
                           "--shapes", "qwen3-1.7b", "--m", "1", "--layers", "1", "--device", "cpu",
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == cli.FAILED and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == f"int8alibi conform: {tmp_path / 'out'}: File exists (EEXIST)"
    assert (tmp_path / "out").read_text() == "kept"
