"""Carrying an archive in parts: every part and the whole checked, nothing joined from a bad part."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from int8alibi.tools import carry


def _archive(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "kit.tar.xz"
    path.write_bytes(os.urandom(size))
    return path


def _carry_all(out: Path, store: Path) -> None:
    for folder in sorted((p for p in out.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
        carry.stash([folder], store)  # one upload per folder, as on the GPU host


@pytest.mark.parametrize("size", [1, 99, 100, 101, 1000])
def test_parts_join_back_to_the_same_bytes_at_part_boundaries(tmp_path: Path, size: int) -> None:
    archive = _archive(tmp_path, size)
    manifest = carry.split(archive, tmp_path / "out", part_bytes=100, folder_bytes=300)
    assert [p["bytes"] for p in manifest["parts"]] == [100] * (size // 100) + ([size % 100] if size % 100 else [])
    assert all(int(p["folder"]) == i // 3 + 1 for i, p in enumerate(manifest["parts"]))  # three parts per upload
    for folder in (tmp_path / "out").iterdir():
        if folder.is_dir():
            assert sum(f.stat().st_size for f in folder.glob("part-*")) <= 300
    _carry_all(tmp_path / "out", tmp_path / "store")
    joined = carry.join(tmp_path / "store", tmp_path / "joined")
    assert joined.read_bytes() == archive.read_bytes()


def test_a_missing_part_names_it_and_its_upload_folder(tmp_path: Path) -> None:
    carry.split(_archive(tmp_path, 450), tmp_path / "out", part_bytes=100, folder_bytes=200)
    carry.stash([tmp_path / "out" / "1", tmp_path / "out" / "3"], tmp_path / "store")
    with pytest.raises(carry.CarryError, match=r"2 of 5 parts not stashed yet \(first: part-002, from upload folder 2\)"):
        carry.join(tmp_path / "store", tmp_path / "joined")
    assert not (tmp_path / "joined").exists()


def test_an_altered_or_truncated_part_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    carry.split(_archive(tmp_path, 300), tmp_path / "out", part_bytes=100, folder_bytes=300)
    _carry_all(tmp_path / "out", tmp_path / "store")
    part = tmp_path / "store" / "part-001"
    data = bytearray(part.read_bytes())
    data[0] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(carry.CarryError, match="part-001: size or SHA-256 differs"):
        carry.join(tmp_path / "store", tmp_path / "joined")
    part.write_bytes(bytes(data[:-1]))
    with pytest.raises(carry.CarryError, match="part-001: size or SHA-256 differs"):
        carry.join(tmp_path / "store", tmp_path / "joined")
    assert not (tmp_path / "joined").exists() and not (tmp_path / "joined.partial").exists()


def test_a_manifest_whose_whole_digest_disagrees_is_refused(tmp_path: Path) -> None:
    carry.split(_archive(tmp_path, 250), tmp_path / "out", part_bytes=100, folder_bytes=300)
    _carry_all(tmp_path / "out", tmp_path / "store")
    path = tmp_path / "store" / carry.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["sha256"] = "0" * 64
    path.write_text(json.dumps(manifest))
    with pytest.raises(carry.CarryError, match="joined archive's SHA-256 differs"):
        carry.join(tmp_path / "store", tmp_path / "joined")
    assert not (tmp_path / "joined").exists() and not (tmp_path / "joined.partial").exists()


def test_bad_manifests_sizes_and_empty_archives_are_refused(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / carry.MANIFEST).write_text('{"format": "other"}')
    with pytest.raises(carry.CarryError, match="not an int8alibi-carry/1 manifest"):
        carry.join(tmp_path / "store", tmp_path / "joined")
    with pytest.raises(carry.CarryError, match="no such file|not a readable"):
        carry.read_manifest(tmp_path / "absent.json")
    with pytest.raises(carry.CarryError, match="folder size"):
        carry.split(_archive(tmp_path, 10), tmp_path / "out", part_bytes=200, folder_bytes=100)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(carry.CarryError, match="empty archive"):
        carry.split(empty, tmp_path / "out2", part_bytes=10, folder_bytes=10)


def test_the_command_line_reports_failures_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = _archive(tmp_path, 3 << 20)
    assert carry.main(["split", str(archive), str(tmp_path / "out"), "--part-mib", "1", "--folder-mib", "2"]) == 0
    assert "3 parts, upload folders ['1', '2']" in capsys.readouterr().out
    assert carry.main(["stash", str(tmp_path / "store"), str(tmp_path / "out" / "2")]) == 0
    assert carry.main(["join", str(tmp_path / "store"), str(tmp_path / "joined")]) == 1
    assert "parts not stashed yet" in capsys.readouterr().err
    assert carry.main(["stash", str(tmp_path / "store"), str(tmp_path / "out" / "1")]) == 0
    assert carry.main(["join", str(tmp_path / "store"), str(tmp_path / "joined")]) == 0
    assert (tmp_path / "joined").read_bytes() == archive.read_bytes()
