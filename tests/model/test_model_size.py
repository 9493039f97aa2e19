"""The parent's size before loading it: counts equal the built model's, for every source."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.model.package import gguf_package_file
from int8alibi.model.size import ModelSize, from_hf_config, gguf_header, model_size, read_hf_config
from int8alibi.model.synthetic import parameter_shapes, synthetic_config
from int8alibi.model.synthetic_presets import PRESETS


def small() -> ModelSize:
    return ModelSize(blocks=1, hidden=16, intermediate=32, heads=2, kv_heads=1, head_dim=8, vocab=64, tied=True)


def test_counts_of_a_hand_sized_decoder():
    s = small()
    # q 16x16, k and v 16x8, o 16x16, gate and up 16x32, down 32x16
    assert s.linear_params == 256 + 128 + 128 + 256 + 512 + 512 + 512 == 2304
    assert s.linear_rows == 16 + 8 + 8 + 16 + 32 + 32 + 16 == 128
    assert s.linear_inputs == 6 * 16 + 32 == 128
    assert s.params == 2304 + 64 * 16 + (2 * 16 + 16) == 3376  # linears, tied embedding, norms
    assert s.parent_bytes == 6752
    assert s.checkpoint_bytes == 2304 + 4 * 128 + 2 * (3376 - 2304) == 4960
    assert s.forward_flops_per_token == 2 * (2304 + 1024)
    untied = ModelSize(**{**s.__dict__, "tied": False})
    assert untied.params == s.params + 1024


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_counts_equal_the_meta_built_model(name):
    size = model_size({"source": "synthetic", "synthetic": {"preset": name}})
    built = sum(torch.Size(shape).numel() for shape in parameter_shapes(synthetic_config(name)).values())
    assert size.params == built


def test_hf_folder_and_gguf_package_sizes(tmp_path):
    fields = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "vocab_size": 64, "tie_word_embeddings": True, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    assert model_size({"source": "hf", "parent": str(tmp_path)}) == small()  # head_dim = 16 / 2
    gguf = model_size({"source": "gguf-package"})
    assert gguf.params == 134_515_008  # SmolLM2-135M: the GGUF file's tensors, element by element


def test_gguf_header_reads_what_the_gguf_package_reads():
    from gguf import GGUFReader

    path = gguf_package_file()
    fields, tensors = gguf_header(path)
    reader = GGUFReader(str(path))  # the reference reader, independent of ours
    assert tensors == {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the header (version, counts)
            continue
        expected = field.contents()
        assert fields[key] == (len(expected) if isinstance(expected, list) else expected), key


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)  # truncated after the version
    with pytest.raises(InputError, match="x.gguf: not a readable GGUF file"):
        gguf_header(bad)
    bad.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(InputError, match="no GGUF magic"):
        gguf_header(bad)
    # one field: a string array of two strings whose second claims more bytes than the file holds
    key = struct.pack("<Q", 1) + b"k"
    array = struct.pack("<IIQ", 9, 8, 2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 50) + b"bc"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + array)
    with pytest.raises(InputError, match="a string array runs past the end of the file"):
        gguf_header(bad)


def test_unusable_sources_are_named():
    with pytest.raises(InputError, match="unset variable"):
        model_size({"source": "hf", "parent": "${QWEN3_14B_DIR}"})
    with pytest.raises(InputError, match="num_hidden_layers must be a positive integer"):
        from_hf_config({"hidden_size": 8, "num_attention_heads": 1, "intermediate_size": 8, "vocab_size": 8})
    with pytest.raises(InputError, match="preset 'huge' unknown"):
        model_size({"source": "synthetic", "synthetic": {"preset": "huge"}})


def test_unreadable_config_json_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json: not readable JSON"):
        read_hf_config(tmp_path / "config.json")
