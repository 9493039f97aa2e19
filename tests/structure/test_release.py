"""The release's conventions: one version everywhere it is written (pyproject.toml, CITATION.cff, the
package, CHANGELOG.md's newest release, with CITATION.cff's date), and a CI workflow file that runs
the lanes .ci/run defines, by calling .ci/run, on every push and pull request, on each Python the
package supports."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

import int8alibi

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def test_every_place_names_the_newest_changelog_release() -> None:
    releases = RELEASE.findall((ROOT / "CHANGELOG.md").read_text())
    assert releases, "CHANGELOG.md has no '## [x.y.z] - YYYY-MM-DD' release heading"
    version, date = releases[0]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert (project["version"], str(citation["version"]), int8alibi.__version__) == (version, version, version)
    assert str(citation["date-released"]) == date
    assert [d for _, d in releases] == sorted((d for _, d in releases), reverse=True), "releases not newest first"


def _lanes() -> set[str]:
    """The lanes .ci/run runs when given none: all of them."""
    found = re.search(r"^\[ \$\{#lanes\[@\]\} -gt 0 \] \|\| lanes=\(([\w ]+)\)$", (ROOT / ".ci" / "run").read_text(),
                      re.M)
    assert found, ".ci/run: the default lane list was not found"
    return set(found.group(1).split())


def test_the_ci_workflow_runs_each_lane_of_ci_run_through_it() -> None:
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yaml").read_text())
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert {"push", "pull_request"} <= set(triggers)
    called = {}
    for name, job in flow["jobs"].items():
        runs = [step["run"] for step in job["steps"] if "run" in step]
        assert runs == [f".ci/run {name}"], (name, runs)
        called[name] = job
    assert set(called) == _lanes()
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    supported = [f"3.{minor}" for minor in range(8, 20) if requires.contains(f"3.{minor}.0")]
    assert called["fast"]["strategy"]["matrix"]["python"] == supported
