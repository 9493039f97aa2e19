"""The config's hostile-input boundaries: the results folder (relative, plain, inside the checkout,
or under an explicit results_root), schema maxima and short messages, shared references, booleans
typed on the command line, and the run config written once per expanded config and never rewritten."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from int8alibi.config import (RESOLVED, check_bounded, command_line_booleans, config_key, current_run_config,
                              earlier_plan, results_dir, run_config_path, validate, write_run_config)
from int8alibi.errors import InputError

from .conftest import user_config



@pytest.mark.parametrize("results", [
    "x;touch pwned;echo ",        # shell injection
    "ri --help;touch a file",
    "$(touch pwned)",
    "`touch pwned`",
    "results\nother",             # a newline
    "../../elsewhere",            # out of the tree
    "results/../..",
    ".",
    "results/.hidden",
    "/abs/results",               # absolute: results_root is the way
    "with space",
    "",
    "a" * 5000,
])
def test_results_outside_the_plain_relative_form_are_refused_by_name(checkout: Path, results: str) -> None:
    with pytest.raises(InputError, match=r"^config: results .* (is not a relative path of plain segments|resolves to)"):
        results_dir({"results": results}, checkout)
    assert not list(checkout.iterdir())  # nothing created


def test_a_symlink_out_of_the_tree_is_refused(checkout: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkout / "results_link").symlink_to(outside)
    with pytest.raises(InputError, match=r"results 'results_link' resolves to .*outside, outside the checkout"):
        results_dir({"results": "results_link"}, checkout)
    (checkout / "inner").mkdir()
    (checkout / "via").symlink_to(checkout / "inner")  # a link that stays inside is fine
    assert results_dir({"results": "via/results"}, checkout) == "via/results"
    assert not list(outside.iterdir())


@pytest.mark.parametrize("results", ["preregistration", "amendments/x", "workflow/int8alibi", "logs", "config"])
def test_results_inside_a_project_folder_are_refused(checkout: Path, results: str) -> None:
    with pytest.raises(InputError, match=r"inside the project's own folder"):
        results_dir({"results": results}, checkout)
    (checkout / "data").mkdir()
    (checkout / "elsewhere").symlink_to(checkout / "workflow")  # a link into one is refused too
    with pytest.raises(InputError, match=r"inside the project's own folder workflow/"):
        results_dir({"results": "elsewhere/results"}, checkout)
    assert results_dir({"results": "data/results"}, checkout) == "data/results"
    # results_root pointing back into the checkout gets the same check
    with pytest.raises(InputError, match=r"inside the project's own folder preregistration/"):
        results_dir({"results": "preregistration", "results_root": str(checkout)}, checkout)


def test_results_root_is_the_escape_hatch(checkout: Path) -> None:
    assert results_dir({"results": "results/qwen3-8b"}, checkout) == "results/qwen3-8b"
    assert results_dir({"results": "results", "results_root": "/scratch/me"}, checkout) == "/scratch/me/results"
    for root in ("relative/dir", "/scratch/a b", "/scratch/x;rm", "/scratch/../etc", "/scratch/\n"):
        with pytest.raises(InputError, match=r"results_root .* must be an absolute path of plain segments"):
            results_dir({"results": "results", "results_root": root}, checkout)


@pytest.mark.parametrize(("override", "where"), [
    ({"faults_shards": 1e20}, r"faults_shards: 1e\+20 is greater than the maximum of 1024"),
    ({"faults_shards": 100000}, "faults_shards: 100000 is greater than the maximum of 1024"),
    ({"faults_shards": 0}, "faults_shards: 0 is less than the minimum of 1"),
    ({"faults_shards": "8"}, "faults_shards: '8' is not of type 'integer'"),
    ({"results": "x;touch pwned;echo "}, "results: 'x;touch pwned;echo ' does not match"),
    ({"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": "zero"}}},
     "model/synthetic/seed: 'zero' is not of type 'integer'"),
    ({"crossmodel": ["results/a\n;touch x"]}, "crossmodel/0: .* does not match"),
])
def test_schema_refuses_with_the_key(override: dict, where: str) -> None:
    with pytest.raises(InputError, match=rf"^cfg\.yaml: invalid config at {where}"):
        validate(user_config(**override), "cfg.yaml")


def test_a_huge_value_is_named_without_being_dumped() -> None:
    huge = "x" * 10_000_000
    for override in ({"size_profile": huge}, {"model": {"source": "gguf-package", "gguf_package": huge}},
                     {huge: 1}):
        with pytest.raises(InputError) as info:
            validate(user_config(**override), "cfg.yaml")
        message = str(info.value)
        assert message.startswith("cfg.yaml: invalid config at ") and len(message) < 1000, message[:300]


def test_shared_references_and_oversized_configs_are_refused_before_any_walk() -> None:
    leaf = ["lol"] * 9
    bomb = leaf
    for _ in range(30):  # 9**30 leaves if walked: refused at the second sight of a container
        bomb = [bomb] * 9
    start = time.process_time()
    with pytest.raises(InputError, match=r"cfg: a value is repeated by reference \(a YAML alias\)"):
        check_bounded(user_config(crossmodel=bomb), "cfg")
    assert time.process_time() - start < 5  # bounded work: a walk would never end
    with pytest.raises(InputError, match=r"cfg: more than 10000 values"):
        check_bounded(user_config(crossmodel=[str(i) for i in range(20_000)]), "cfg")
    check_bounded(user_config(), "cfg")  # a real config passes


def test_booleans_spelled_as_yaml_on_the_command_line() -> None:
    for text, value in (("true", True), ("false", False)):
        config = user_config(exploratory=text)
        command_line_booleans(config, {"exploratory": text})
        assert config["exploratory"] is value
        validate(config, "cfg")
    config = user_config(exploratory="yes")  # not YAML 1.2's spelling: left for the schema to refuse
    command_line_booleans(config, {"exploratory": "yes"})
    with pytest.raises(InputError, match="exploratory: 'yes' is not of type 'boolean'"):
        validate(config, "cfg")


def _planned(data: dict, host: str = "h") -> dict:
    return {**data, RESOLVED: {"spec": {"device": data["device"], "arms": data["arms"]}, "device": "cpu",
                               "arms": ["exact-cutlass-order", "exact-triton-order"],
                               "reason": {"device": "d", "arms": "a"}, "host": host, "unavailable": {}}}


def test_one_run_config_per_expanded_config_written_once(checkout: Path) -> None:
    plain, exploratory = user_config(), user_config(exploratory=True)
    assert config_key(plain) != config_key(exploratory) and config_key(plain) == config_key(_planned(plain))
    path = Path(run_config_path("results", plain))
    assert path.parent.parent == Path("results/.run") and path.name == "config.yaml"
    assert earlier_plan(path, "results", plain) is None  # nothing planned yet
    write_run_config(_planned(plain), path)
    first = path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_ino
    os.utime(path, ns=(1, 1))
    write_run_config(_planned(plain), path)  # the same plan again: the file is not touched
    assert (path.read_bytes(), path.stat().st_ino) == first[::2] and path.stat().st_mtime_ns == 1
    assert current_run_config("results") == path
    with pytest.raises(InputError, match=r"differs from the plan made now .* never rewritten"):
        write_run_config(_planned(plain, host="elsewhere"), path)
    assert path.read_bytes() == first[0]
    # another config gets its own file; the first one's bytes stay as they were
    other = Path(run_config_path("results", exploratory))
    assert earlier_plan(other, "results", exploratory)[RESOLVED]["host"] == "h"  # reused from .run/current
    write_run_config(_planned(exploratory), other)
    assert other != path and path.read_bytes() == first[0] and current_run_config("results") == other


def test_an_edited_run_config_is_refused_by_name(checkout: Path) -> None:
    plain = user_config()
    path = Path(run_config_path("results", plain))
    write_run_config(_planned(plain), path)
    path.write_text(path.read_text().replace("exploratory: false", "exploratory: true"))
    with pytest.raises(InputError, match=rf"{path}: this run config was edited after it was written"):
        earlier_plan(path, "results", plain)
    path.write_text("- not a mapping\n")
    with pytest.raises(InputError, match=rf"{path}: a run config must be a mapping"):
        earlier_plan(path, "results", plain)
    (path.parent.parent / "current").write_text("../../etc/passwd\n")
    with pytest.raises(InputError, match=r"current: expected '<digest>/config.yaml'"):
        current_run_config("results")


def test_an_empty_a_fifo_or_a_non_utf8_config_is_one_named_error(tmp_path) -> None:
    import os

    import pytest as _pytest

    from int8alibi.config import load_config
    from int8alibi.errors import InputError

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model: café\n".encode("latin-1"))
    for path, words in ((empty, "empty"), (fifo, "not a regular file (a FIFO"), (latin, "not UTF-8 text")):
        with _pytest.raises(InputError) as caught:
            load_config(path)
        assert str(caught.value).startswith(f"{path}: ") and words in str(caught.value)
