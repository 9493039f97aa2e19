"""A stage binds the protocol it started under (``stage_main``, ``provenance.manifest.bind_protocol``):
an amendment made while it runs stops it with one line naming the change, its folder as it was, rather
than recording tables computed under the old protocol in a manifest that names the new one."""

from __future__ import annotations

from pathlib import Path

from int8alibi.provenance.manifest import write_manifest
from int8alibi.runtime.runner import stage_main

from ..provenance.provenance_project import PROTOCOL_FILES, make_protocol_stub, use_protocol
from .test_runner_transaction import config, previous, tree


def test_an_amendment_made_while_a_stage_runs_stops_it_and_keeps_its_previous_outputs(tmp_path, monkeypatch, capsys):
    root = tmp_path / "project"
    for name, text in PROTOCOL_FILES.items():
        (root / "preregistration").mkdir(parents=True, exist_ok=True)
        (root / "preregistration" / name).write_text(text)
    (root / "amendments").mkdir()
    (root / "amendments" / "A-0001.yaml").write_text("id: A-0001\n")
    use_protocol(monkeypatch, make_protocol_stub())
    monkeypatch.chdir(root)
    out = root / "results" / "model"
    before = previous(out)
    cfg = config(tmp_path)

    def stage(amend: bool):
        def run(cfg, out_dir: Path) -> None:
            (out_dir / "result.txt").write_bytes(b"computed under A-0001")
            if amend:  # the lead amends the protocol meanwhile
                (root / "amendments" / "A-0002.yaml").write_text("id: A-0002\n")
            write_manifest(out_dir, stage="model", outputs={"result": out_dir / "result.txt"}, inputs={},
                           params={}, device="cpu")
        run.__module__ = "int8alibi.stages.model"
        return run

    assert stage_main(stage(amend=True), ["--config", str(cfg), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("int8alibi: stage model failed: "), err
    assert "the protocol changed while stage model ran (amendments/A-0002.yaml added)" in err[0]
    assert tree(out) == before
    # the next run starts under the amended protocol and records it
    assert stage_main(stage(amend=False), ["--config", str(cfg), "--out", str(out)]) == 0
    assert (out / "result.txt").read_bytes() == b"computed under A-0001"
