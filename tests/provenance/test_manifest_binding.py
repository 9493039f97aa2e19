"""A manifest binds the protocol its stage started under (``manifest.bind_protocol``): one written after
the protocol's files changed (an edited protocol file, an added amendment) is refused with one line
naming what changed, so a stage's tables are never recorded under a protocol they were not computed
under; nothing changed, or a manifest of another project, is written as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi.errors import ProtocolError
from int8alibi.provenance.manifest import bind_protocol, protocol_state, write_manifest
from int8alibi.provenance.manifest_format import load_manifest


def _write(project: Path) -> Path:
    stage = project / "results" / "gamma"
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "table.txt").write_text("computed\n")
    return write_manifest(stage, stage="gamma", outputs=[stage / "table.txt"], inputs=[], params={},
                          protocol_root=project / "preregistration", device="cpu")


def test_nothing_changed_writes_the_manifest(project: Path) -> None:
    with bind_protocol(project):
        assert load_manifest(_write(project))["stage"] == "gamma"


@pytest.mark.parametrize("change, named", [
    (lambda root: (root / "preregistration" / "thresholds.yaml").write_text("ulp_tolerance: 2\n"),
     "preregistration/thresholds.yaml changed"),
    (lambda root: (root / "amendments" / "A-0003.yaml").write_text("id: A-0003\n"), "amendments/A-0003.yaml added"),
    (lambda root: (root / "preregistration" / "faults.yaml").unlink(), "preregistration/faults.yaml removed"),
], ids=["protocol file edited", "amendment added", "protocol file removed"])
def test_a_protocol_change_while_the_stage_ran_refuses_its_manifest(project: Path, change, named: str) -> None:
    (project / "amendments").mkdir()
    (project / "amendments" / "A-0002.yaml").write_text("id: A-0002\n")
    with bind_protocol(project):
        change(project)
        with pytest.raises(ProtocolError) as err:
            _write(project)
    message = str(err.value)
    assert "\n" not in message and "results/gamma/manifest.json" in message
    assert f"the protocol changed while stage gamma ran ({named})" in message and "run the stage again" in message
    assert not (project / "results" / "gamma" / "manifest.json").exists()


def test_a_manifest_outside_the_binding_or_of_another_project_is_not_checked(project: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    (other / "preregistration").mkdir(parents=True)
    with bind_protocol(other):
        (project / "preregistration" / "thresholds.yaml").write_text("ulp_tolerance: 3\n")
        _write(project)
    _write(project)


def test_links_are_named_and_empty_folders_change_nothing(project: Path) -> None:
    before = protocol_state(project)
    (project / "amendments").mkdir()
    assert protocol_state(project) == before
    (project / "amendments" / "link.yaml").symlink_to(project / "preregistration" / "faults.yaml")
    assert protocol_state(project)["amendments/link.yaml"].startswith("not a file (a link to ")
