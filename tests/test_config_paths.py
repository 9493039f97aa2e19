"""Config values that become paths or imports while planning: arm names (path parts of the generate
jobs' outputs and logs), the GGUF package (found, never imported, by a single identifier), and the
results folder under results_root (never a file, another checkout's top or its protocol folders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from int8alibi.arm_names import ARM_PATTERN, check_names
from int8alibi.config import SCHEMA_PATH, results_dir, validate
from int8alibi.errors import InputError

from .conftest import user_config
from int8alibi.snakefile.rerun import source_files



def other_checkout(folder: Path) -> Path:
    """A second checkout of the project: its protocol and amendment folders and its Snakefile."""
    for name in ("amendments", "preregistration", "results"):
        (folder / name).mkdir(parents=True)
    (folder / "Snakefile").write_text("# another checkout\n")
    return folder


BAD_ARMS = ["../../escape:f", "a/b:f", "x:f\n", "x:../f", "mod:f g", " mod:f", "..:f", "m:f/x", "exact-cutlass-order/.."]


@pytest.mark.parametrize("name", BAD_ARMS)
def test_an_arm_name_that_is_no_plain_path_part_is_refused(name: str) -> None:
    with pytest.raises(InputError, match=r"^cfg\.yaml: invalid config at arms/0: .* does not match"):
        validate(user_config(arms=[name, "exact-triton-order"]), "cfg.yaml")
    with pytest.raises(InputError, match=r"^config: arms: unknown kernel arm"):
        check_names([name, "exact-triton-order"])


def test_a_planned_block_with_such_an_arm_is_refused_too() -> None:
    data = user_config(device="cpu", arms="auto")
    data["resolved"] = {"spec": {"device": "cpu", "arms": "auto"}, "device": "cpu", "arms": ["../x:f", "triton"],
                        "reason": {"device": "d", "arms": "a"}, "host": "h"}
    with pytest.raises(InputError, match=r"^run\.yaml: invalid config at resolved/arms/0: '\.\./x:f' does not match"):
        validate(data, "run.yaml")


def test_registered_and_module_function_arms_pass_and_the_schema_holds_the_same_pattern() -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]
    assert schema["arms"]["oneOf"][1]["items"]["pattern"] == ARM_PATTERN
    assert schema["resolved"]["properties"]["arms"]["items"]["pattern"] == ARM_PATTERN
    for pair in (["exact-cutlass-order", "vllm-triton"], ["mymodule:my_mm", "pkg.sub_2:fn"]):
        validate(user_config(arms=pair), "cfg.yaml")
        check_names(pair)


@pytest.mark.parametrize("name", ["marker_pkg_h45.sub", "${GGUF_PACKAGE}", "a b", "x\n", "../x"])
def test_a_gguf_package_that_is_not_one_identifier_is_refused_before_anything_is_imported(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "marker_pkg_h45"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = user_config(model={"source": "gguf-package", "gguf_package": name})
    with pytest.raises(InputError, match=r"^cfg\.yaml: invalid config at model/gguf_package: .* does not match"):
        validate(config, "cfg.yaml")  # planning validates first, then lists the source files
        source_files(config)
    assert not (tmp_path / "imported").exists() and "marker_pkg_h45" not in sys.modules


@pytest.mark.parametrize("results", ["amendments", "preregistration/x", "workflow"])
def test_results_root_into_another_checkouts_project_folders_is_refused(checkout: Path, tmp_path: Path,
                                                                         results: str) -> None:
    other = other_checkout(tmp_path / "other")
    with pytest.raises(InputError, match=rf"^config: results '{other}/{results}' resolves to .*, inside the "
                                         rf"project's own folder {results.split('/')[0]}/"):
        results_dir({"results": results, "results_root": str(other)}, checkout)
    deeper = other / "preregistration"  # a root inside one of its project folders
    with pytest.raises(InputError, match=r"inside the project's own folder preregistration/"):
        results_dir({"results": "results", "results_root": str(deeper)}, checkout)
    with pytest.raises(InputError, match=rf"inside the top folder of the checkout {other}"):
        results_dir({"results": "other", "results_root": str(tmp_path)}, checkout)
    assert results_dir({"results": "results/run", "results_root": str(other)}, checkout) == f"{other}/results/run"
    assert sorted(p.name for p in other.iterdir()) == ["Snakefile", "amendments", "preregistration", "results"]


def test_results_naming_a_project_folder_are_refused_under_any_results_root(checkout: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    for results in ("amendments", "preregistration/run", "dev"):
        with pytest.raises(InputError, match=rf"^config: results '{scratch}/{results}' names a project folder "
                                             rf"\({results.split('/')[0]}/\), not a results folder"):
            results_dir({"results": results, "results_root": str(scratch)}, checkout)
    assert results_dir({"results": "runs/amendments", "results_root": str(scratch)}, checkout)  # a plain sub-name
    assert not scratch.exists()


def test_results_naming_an_existing_file_are_refused(checkout: Path, tmp_path: Path) -> None:
    (checkout / "README.md").write_text("the project\n")
    for results in ("README.md", "README.md/run"):
        with pytest.raises(InputError, match=rf"^config: results '{results}' resolves to .*, but "
                                             rf"({checkout}/README.md|it) is an existing file, not a folder"):
            results_dir({"results": results}, checkout)
    (tmp_path / "root_file").write_text("")
    with pytest.raises(InputError, match=r"root_file is an existing file, not a folder"):
        results_dir({"results": "results", "results_root": str(tmp_path / "root_file")}, checkout)
    assert (checkout / "README.md").read_text() == "the project\n"


def test_a_crossmodel_folder_ending_in_a_newline_is_refused() -> None:
    """A pattern's `$` also matches before a final newline; the schema's `(?!\\n)` closes that gap."""
    with pytest.raises(InputError, match=r"invalid config at crossmodel/0"):
        validate(user_config(crossmodel=["results/a\n", "results/b"]), "cfg.yaml")
    validate(user_config(crossmodel=["results/a", "results/b"]), "cfg.yaml")
