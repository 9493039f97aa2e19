"""Atomic writes under faults: a full disk (ENOSPC) is a DiskFullError naming the file and leaves
nothing partial; temporaries of a killed writer are removed (dead process on this host) or reported
(anyone else's) by the next run of the stage."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from int8alibi.errors import DiskFullError
from int8alibi.files import atomic, parquet
from int8alibi.files.atomic import sweep_stale, temp_dir, temp_prefix, write_bytes
from int8alibi.runtime.runner import stage_main

PROJECT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.binary(), nullable=False)])


def frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"k": np.arange(rows), "v": [rng.bytes(1024) for _ in range(rows)]})


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A 64 KiB tmpfs (needs mount permission, as root in CI); not applicable where mount is refused."""
    point = tmp_path / "tmpfs"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"not applicable: cannot mount a tmpfs here ({done.stderr.decode().strip()}); the "
                    "monkeypatched ENOSPC tests below still run")
    yield point
    subprocess.run(["umount", str(point)], check=True)


def test_enospc_on_a_real_tiny_tmpfs_is_named_and_leaves_nothing(tiny_tmpfs: Path) -> None:
    target = tiny_tmpfs / "stage" / "big.parquet"
    with pytest.raises(DiskFullError, match=rf"{target}: disk full while writing \(\d+ bytes free"):
        parquet.write_table(frame(200), target, SCHEMA, ["k"])  # ~200 KB into 64 KiB
    assert list(target.parent.iterdir()) == []  # no partial file, no temporary
    with pytest.raises(DiskFullError, match=r"raw\.bin: disk full"):
        write_bytes(tiny_tmpfs / "raw.bin", b"0" * 200_000)
    assert not (tiny_tmpfs / "raw.bin").exists()
    small = parquet.write_table(frame(2), tiny_tmpfs / "stage" / "small.parquet", SCHEMA, ["k"])  # room enough
    assert parquet.read_arrow(small).num_rows == 2


def write_big_table(cfg, out_dir: Path) -> None:
    """A stage body: one table larger than the disk."""
    parquet.write_table(frame(200), out_dir / "big.parquet", SCHEMA, ["k"])


def test_a_stage_on_a_full_disk_ends_in_one_named_line(tiny_tmpfs: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text((PROJECT / "config" / "config.yaml").read_text())
    code = stage_main(write_big_table, ["--config", str(config), "--out", str(tiny_tmpfs / "stage")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("int8alibi: stage test_atomic failed: ") and err.count("\n") == 1, err
    assert f"{tiny_tmpfs / 'stage' / 'big.parquet'}: disk full while writing" in err
    assert list((tiny_tmpfs / "stage").iterdir()) == []  # nothing partial


def test_enospc_from_a_library_without_errno_is_named_monkeypatched(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Monkeypatched (not a real full disk): pyarrow reports ENOSPC as an OSError with the message only."""
    def full(*args, **kwargs):
        raise OSError("IOError: No space left on device. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(parquet.pq, "write_table", full)
    target = tmp_path / "t.parquet"
    with pytest.raises(DiskFullError, match=r"t\.parquet: disk full"):
        parquet.write_table(frame(2), target, SCHEMA, ["k"])
    assert list(tmp_path.iterdir()) == []


def test_enospc_creating_a_temporary_folder_is_named_monkeypatched(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Monkeypatched: mkdtemp raising errno 28."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", full)
    with pytest.raises(DiskFullError, match=r"operands: disk full"):
        temp_dir(tmp_path, "operands")


def test_other_os_errors_are_not_mistaken_for_a_full_disk(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        with atomic.atomic_path(tmp_path / "x") as tmp:
            tmp.unlink()
            tmp.mkdir()
            raise IsADirectoryError(errno.EISDIR, "is a directory")


KILLED_WRITER = """
import os, signal, sys
from int8alibi.files.atomic import temp_dir
staging = temp_dir(sys.argv[1], "operands")
(staging / "layer0.pt").write_bytes(b"0" * 1_000_000)
print(staging, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkilled_writers_folder_is_removed_by_the_next_sweep(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL
    staging = Path(done.stdout.strip())
    assert staging.is_dir() and staging.name.startswith(".operands.")
    lines = sweep_stale(tmp_path)
    assert lines == [f"removed {staging} (1000000 bytes), left by process {staging.name.split('-')[-1].split('.')[0]}"
                     " that no longer runs"]
    assert not staging.exists()


def test_temporaries_of_live_processes_other_hosts_or_unknown_owners_are_reported_not_removed(tmp_path: Path) -> None:
    live = tmp_path / f"{temp_prefix('pins.parquet')}abc.tmp"  # this very process: alive
    live.write_bytes(b"1")
    remote = tmp_path / "sub" / ".capture.other-host-12-4242.xyz.tmp"
    remote.mkdir(parents=True)
    unowned = tmp_path / ".capture.k3j_x9.tmp"  # the name an older version gave
    unowned.mkdir()
    lines = sweep_stale(tmp_path)
    assert live.exists() and remote.exists() and unowned.exists()
    assert sorted(lines) == sorted([
        f"left in place {live} (1 bytes): process {os.getpid()} still runs; remove it by hand if no run is using it",
        f"left in place {remote} (0 bytes): written on host other-host-12; remove it by hand if no run is using it",
        f"left in place {unowned} (0 bytes): no owner in its name; remove it by hand if no run is using it",
    ])
    assert sweep_stale(tmp_path / "missing") == []


def write_small_table(cfg, out_dir: Path) -> None:
    parquet.write_table(frame(2), out_dir / "small.parquet", SCHEMA, ["k"])


def test_the_next_run_of_a_stage_removes_a_killed_runs_temporaries(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "stage"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out)], capture_output=True, text=True, timeout=120)
    staging = Path(done.stdout.strip())
    config = tmp_path / "cfg.yaml"
    config.write_text((PROJECT / "config" / "config.yaml").read_text())
    assert stage_main(write_small_table, ["--config", str(config), "--out", str(out)]) == 0
    assert not staging.exists() and sorted(p.name for p in out.iterdir()) == ["small.parquet"]
    assert f"removed {staging} (1000000 bytes)" in caplog.text


def test_a_full_disk_reported_in_a_library_error_type_is_named(tmp_path) -> None:
    """safetensors reports ENOSPC in its own error type, with the OS error only in the message."""
    import pytest as _pytest

    from int8alibi.errors import DiskFullError
    from int8alibi.files.atomic import disk_space

    target = tmp_path / "model.safetensors"
    message = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    with _pytest.raises(DiskFullError, match=r"model\.safetensors: disk full while writing"):
        with disk_space(target):
            raise RuntimeError(message)
    with _pytest.raises(ValueError, match="unrelated"):  # anything else passes through unchanged
        with disk_space(target):
            raise ValueError("unrelated")


def write_big_operands(cfg, out_dir: Path) -> None:
    """A stage body: capture's safetensors writer with more operands than the disk holds."""
    from int8alibi.kernels.layer_operands import save_operands, synthetic_layers

    save_operands(out_dir / "operands" / "own-prefill.safetensors",
                  list(synthetic_layers("qwen3-1.7b", m=64, blocks=1)))


def test_a_full_disk_inside_the_safetensors_writer_is_one_named_line(tiny_tmpfs: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text((PROJECT / "config" / "config.yaml").read_text())
    (tiny_tmpfs / "stage").mkdir()
    (tiny_tmpfs / "stage" / "index.parquet").write_bytes(b"an earlier run's table")
    code = stage_main(write_big_operands, ["--config", str(config), "--out", str(tiny_tmpfs / "stage")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "disk full while writing" in err, err
    assert "Traceback" not in err
    assert [p.name for p in (tiny_tmpfs / "stage").iterdir()] == ["index.parquet"]  # as it was
    assert (tiny_tmpfs / "stage" / "index.parquet").read_bytes() == b"an earlier run's table"
