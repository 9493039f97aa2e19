"""Carry one archive to a machine that takes only small uploads: fixed-size parts, each digested.

A GPU host without network accepts a limited number of bytes per upload, so an archive larger
than that travels as raw byte slices (``part-NNN``), several per upload folder, with a manifest
naming every part's size and SHA-256 and the whole archive's. On the far side the parts are
collected from wherever they arrived, each checked against the manifest, and joined only when all
of them are present and intact; a missing, extra-sized or altered part stops with its name.
Standard library only: it runs before anything else is installed there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

FORMAT = "int8alibi-carry/1"
MANIFEST = "carry-manifest.json"
CHUNK = 1 << 20


class CarryError(Exception):
    """A part or manifest that does not verify: the message names the file and the reason."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(archive: Path, out: Path, part_bytes: int, folder_bytes: int) -> dict:
    """Cut ``archive`` into parts of at most ``part_bytes`` under ``out/<k>/`` folders of at most
    ``folder_bytes`` each (one upload each); the manifest goes into the last folder and ``out``."""
    if part_bytes < 1 or folder_bytes < part_bytes:
        raise CarryError(f"part size {part_bytes} must be >= 1 and <= the folder size {folder_bytes}")
    archive, out = Path(archive), Path(out)
    per_folder = folder_bytes // part_bytes
    parts: list[dict] = []
    with open(archive, "rb") as src:
        while block := src.read(part_bytes):
            index = len(parts)
            folder = out / str(index // per_folder + 1)
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{index:03d}"
            (folder / name).write_bytes(block)
            parts.append({"name": name, "folder": folder.name, "bytes": len(block),
                          "sha256": hashlib.sha256(block).hexdigest()})
    if not parts:
        raise CarryError(f"{archive}: empty archive, nothing to carry")
    manifest = {"format": FORMAT, "archive": archive.name, "bytes": archive.stat().st_size,
                "sha256": _sha256(archive), "parts": parts}
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    (out / MANIFEST).write_text(text)
    (out / parts[-1]["folder"] / MANIFEST).write_text(text)
    return manifest


def read_manifest(path: Path) -> dict:
    """The manifest at ``path``, its shape checked."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CarryError(f"{path}: not a readable carry manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), list) \
            or not data["parts"]:
        raise CarryError(f"{path}: not an {FORMAT} manifest with parts")
    return data


def stash(sources: Iterable[Path], store: Path) -> list[str]:
    """Copy every part (and the manifest) found in ``sources`` into ``store``; the names copied."""
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    copied = []
    for source in sources:
        for item in sorted(Path(source).iterdir()):
            if item.is_file() and (item.name.startswith("part-") or item.name == MANIFEST):
                shutil.copyfile(item, store / item.name)
                copied.append(item.name)
    return copied


def join(store: Path, target: Path) -> Path:
    """Check every part in ``store`` against its manifest and write the archive to ``target``.

    Stops before writing anything if a part is missing, has the wrong size or digest; the joined
    archive is checked against the manifest's whole-file digest before it is kept."""
    store = Path(store)
    manifest = read_manifest(store / MANIFEST)
    missing = [p["name"] for p in manifest["parts"] if not (store / p["name"]).is_file()]
    if missing:
        raise CarryError(f"{store}: {len(missing)} of {len(manifest['parts'])} parts not stashed yet "
                         f"(first: {missing[0]}, from upload folder "
                         f"{next(p['folder'] for p in manifest['parts'] if p['name'] == missing[0])})")
    for part in manifest["parts"]:
        path = store / part["name"]
        if path.stat().st_size != part["bytes"] or _sha256(path) != part["sha256"]:
            raise CarryError(f"{path}: size or SHA-256 differs from {store / MANIFEST}; carry this part again")
    target = Path(target)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as dst:
        for part in manifest["parts"]:
            with open(store / part["name"], "rb") as src:
                shutil.copyfileobj(src, dst, CHUNK)
    if _sha256(partial) != manifest["sha256"]:
        partial.unlink()
        raise CarryError(f"{target}: joined archive's SHA-256 differs from the manifest's")
    partial.replace(target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m int8alibi.tools.carry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split", help="cut an archive into upload folders (here)")
    p.add_argument("archive", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--part-mib", type=int, default=16)
    p.add_argument("--folder-mib", type=int, default=56)
    s = sub.add_parser("stash", help="copy carried parts into a store (there, once per upload)")
    s.add_argument("store", type=Path)
    s.add_argument("sources", type=Path, nargs="+")
    j = sub.add_parser("join", help="verify every part and write the archive (there, after the last upload)")
    j.add_argument("store", type=Path)
    j.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            m = split(args.archive, args.out, args.part_mib << 20, args.folder_mib << 20)
            folders = sorted({p["folder"] for p in m["parts"]}, key=int)
            print(f"{m['archive']}: {m['bytes']} bytes in {len(m['parts'])} parts, upload folders {folders}")
        elif args.command == "stash":
            print(f"stashed {len(stash(args.sources, args.store))} file(s) in {args.store}")
        else:
            print(f"joined and verified {join(args.store, args.target)}")
    except CarryError as exc:
        print(f"int8alibi.tools.carry: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
