"""A Hugging Face parent folder holding something that is not a file: a broken symbolic link or a FIFO
is one named error before anything is loaded, never a traceback or a hang; a folder linked into a
blob store (as the Hugging Face cache lays it out) still loads."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from int8alibi.errors import InputError
from int8alibi.model import sources
from int8alibi.model.synthetic import build_synthetic


def _blob_linked_parent(tmp_path: Path) -> Path:
    """A tiny bf16 HF folder whose files are links into a blob folder, as in the Hugging Face cache."""
    folder, blobs = tmp_path / "snapshot", tmp_path / "blobs"
    build_synthetic("tiny", 0, vocab_size=64).save_pretrained(folder)
    blobs.mkdir()
    for file in sorted(folder.iterdir()):
        file.rename(blobs / file.name)
        file.symlink_to(Path("..", "blobs", file.name))
    return folder


def test_a_broken_link_or_a_fifo_in_the_parent_folder_is_one_named_error(tmp_path: Path) -> None:
    folder = _blob_linked_parent(tmp_path)
    assert sources.load_hf_model(folder).config.vocab_size == 64  # links that resolve are fine
    broken = folder / "model.safetensors.index.json"
    broken.symlink_to(tmp_path / "gone.json")  # read as "no index" before
    with pytest.raises(InputError, match=rf"^{broken}: a broken symbolic link \(to {tmp_path}/gone\.json\) in the "
                                         r"parent folder$"):
        sources.load_hf_model(folder)
    broken.unlink()
    (folder / "sub").mkdir()
    (folder / "sub" / "tokenizer.json").symlink_to("missing")
    with pytest.raises(InputError, match=r"sub/tokenizer\.json: a broken symbolic link \(to missing\)"):
        sources.load_hf_dir(folder)
    (folder / "sub" / "tokenizer.json").unlink()
    fifo = folder / "extra.safetensors"
    os.mkfifo(fifo)

    def stop(*_: object) -> None:
        raise RuntimeError("loading the parent blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        with pytest.raises(InputError, match=rf"^{fifo}: not a regular file \(a FIFO, socket or device\)"):
            sources.load_hf_model(folder)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
