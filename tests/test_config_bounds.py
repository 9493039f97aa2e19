"""Config bounds at their literal values and the results folder's every refusal: 10,000 values,
results_root's length and its first segment, 100 characters a path segment, 60 of a key in a schema
message, results equal to the checkout, and each project folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from int8alibi.config import _check, check_bounded, results_dir
from int8alibi.errors import InputError


def test_ten_thousand_values_pass_and_one_more_is_refused() -> None:
    check_bounded(["v"] * 9_999, "cfg")                      # the list itself and 9,999 strings
    with pytest.raises(InputError, match=r"^cfg: more than 10000 values"):
        check_bounded(["v"] * 10_000, "cfg")
    check_bounded({"a": {"b": ["v"] * 9_997}}, "cfg")       # two mappings, a list, 9,997 strings
    with pytest.raises(InputError, match="more than 10000 values"):
        check_bounded({"a": {"b": ["v"] * 9_998}}, "cfg")


def test_a_shared_container_is_refused_wherever_it_repeats() -> None:
    shared = {"x": 1}
    for data in ({"a": shared, "b": shared}, [shared, [shared]], {"a": [[1], ([2],)], "b": shared, "c": [shared]}):
        with pytest.raises(InputError, match="repeated by reference"):
            check_bounded(data, "cfg")
    check_bounded({"a": {"x": 1}, "b": {"x": 1}, "c": "same text", "d": "same text"}, "cfg")  # equal, not shared


# Every top-level folder of a checkout that holds the project, its environments or bookkeeping.
PROJECT_FOLDERS = ("amendments", "benchmarks", "config", "dev", "docs", "envs", "logs", "preregistration", "profiles",
                   "requirements", "tests", "workflow", ".git", ".snakemake", ".venv", ".venv-llmcompressor")


@pytest.mark.parametrize("folder", PROJECT_FOLDERS)
def test_every_project_folder_is_refused_as_a_results_folder(checkout: Path, folder: str) -> None:
    (checkout / folder).mkdir()
    (checkout / "into").symlink_to(checkout / folder)        # also through a link (dot-folders are reached so)
    with pytest.raises(InputError, match=rf"inside the project's own folder {folder}/"):
        results_dir({"results": "into/run"}, checkout)
    if not folder.startswith("."):                          # a dot-folder is no plain segment anyway
        with pytest.raises(InputError, match=rf"inside the project's own folder {folder}/"):
            results_dir({"results": f"{folder}/run"}, checkout)


def test_folders_that_only_resemble_project_folders_are_fine(checkout: Path) -> None:
    for results in ("results", "results/docs", "my-config", "workflows", "test", "runs/tests"):
        assert results_dir({"results": results}, checkout) == results


def test_results_that_are_the_checkout_itself_are_refused(checkout: Path) -> None:
    (checkout / "self").symlink_to(checkout)
    with pytest.raises(InputError, match="results 'self' resolves to"):
        results_dir({"results": "self"}, checkout)
    with pytest.raises(InputError, match="inside the top folder of the checkout "):
        results_dir({"results": checkout.name, "results_root": str(checkout.parent)}, checkout)


@pytest.mark.parametrize("root", ["/.hidden/runs", "/../runs", "/a b/runs", "/-/..", "/ok/.git"])
def test_every_segment_of_results_root_is_checked_the_first_too(checkout: Path, root: str) -> None:
    with pytest.raises(InputError, match="results_root .* must be an absolute path of plain segments"):
        results_dir({"results": "results", "results_root": root}, checkout)


def test_results_root_of_1000_characters_passes_and_1001_is_refused(checkout: Path, tmp_path: Path) -> None:
    exact = "/" + "/".join(["a" * 99] * 10)
    assert len(exact) == 1000
    assert results_dir({"results": "r", "results_root": exact}, checkout) == f"{exact}/r"
    longer = exact + "b"
    with pytest.raises(InputError, match="results_root .* must be an absolute path"):
        results_dir({"results": "r", "results_root": longer}, checkout)


def test_a_path_segment_of_100_characters_passes_and_101_is_refused(checkout: Path) -> None:
    assert results_dir({"results": "r/" + "a" * 100}, checkout) == "r/" + "a" * 100
    with pytest.raises(InputError, match="is not a relative path of plain segments"):
        results_dir({"results": "r/" + "a" * 101}, checkout)
    assert results_dir({"results": "r", "results_root": "/" + "a" * 100}, checkout) == "/" + "a" * 100 + "/r"
    with pytest.raises(InputError, match="results_root .* must be an absolute path of plain segments"):
        results_dir({"results": "r", "results_root": "/" + "a" * 101}, checkout)


def test_a_schema_error_names_a_key_of_60_characters_whole_and_shortens_61() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    for key, shown in (("k" * 60, "k" * 60 + ":"), ("k" * 61, "k" * 60 + "... (61 characters):")):
        with pytest.raises(InputError, match=rf"^cfg: invalid config at {re.escape(shown)} 'x' is not of type"):
            _check({key: "x"}, schema, "cfg")
