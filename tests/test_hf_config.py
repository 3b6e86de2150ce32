"""Hugging Face configs: an architecture the planner does not read is refused (not planned as a
Llama), and a model folder holding config.json is taken wherever config.json is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.errors import ConfigError
from planner.spec import HF_MODEL_TYPES

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "models"
REQUEST = ("--gpus", "8", "--gpu", "h100", "--global-batch", "32", "--seq", "1024", "--tp", "8")
LLAMA_KEYS = {
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_hidden_layers": 4,
    "intermediate_size": 2048,
    "vocab_size": 1000,
}


def _model_folder(tmp_path: Path, name: str, config: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_supported_model_types_are_those_the_reader_handles():
    assert {
        "llama",
        "mistral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
        "gpt2",
        "gpt_bigcode",
        "bloom",
    } == set(HF_MODEL_TYPES)


@pytest.mark.parametrize("model_type", ["gpt_neox", "falcon", "gemma2"])
def test_unknown_model_type_is_refused_naming_the_supported_ones(cli, tmp_path, model_type):
    """Llama keys do not make an unknown architecture a Llama."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": model_type, **LLAMA_KEYS}))
    code, out, err = cli("evaluate", "--model", str(config), *REQUEST)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert f"model_type '{model_type}'" in err
    assert f"supported model_types: {', '.join(HF_MODEL_TYPES)}" in err


def test_config_without_model_type_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_KEYS))
    with pytest.raises(ConfigError, match="no model_type names an architecture.*supported model_types: bloom"):
        resolve_model(str(config))


def test_model_folder_is_read_as_its_config_json(cli, tmp_path):
    config = json.loads((EXAMPLES / "llama3-8b" / "config.json").read_text())
    folder = _model_folder(tmp_path, "my-model", config)
    code, out, err = cli("evaluate", "--model", str(folder), *REQUEST, "--json")
    assert code == 0, err
    from_folder = json.loads(out)
    code, out, err = cli("evaluate", "--model", str(folder / "config.json"), *REQUEST, "--json")
    assert code == 0, err
    from_file = json.loads(out)
    assert (from_folder["model"], from_folder["plans"]) == (from_file["model"], from_file["plans"])
    assert from_folder["model"]["name"] == "my-model"
    assert from_folder["model"]["num_layers"] == 32


def test_plan_takes_a_model_folder(cli, tmp_path):
    folder = _model_folder(tmp_path, "small", {"model_type": "qwen3", **LLAMA_KEYS, "head_dim": 64})
    code, out, err = cli("plan", "--model", str(folder), *REQUEST[:-2], "--top", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["model"]["name"] == "small"


def test_folder_without_config_json_is_one_error_line(cli, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    code, _, err = cli("evaluate", "--model", str(folder), *REQUEST)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: model folder {folder} holds no config.json")


def test_early_bloom_config_with_n_embed_is_read(tmp_path):
    """BLOOM's first configs named the width n_embed (bigscience/bloom-560m)."""
    config = {"model_type": "bloom", "n_embed": 1024, "n_layer": 24, "num_attention_heads": 16, "vocab_size": 250880}
    spec = resolve_model(str(_model_folder(tmp_path, "bloom-560m", config)))
    assert (spec.family, spec.hidden_size, spec.num_layers, spec.num_attention_heads) == ("gpt", 1024, 24, 16)
    assert spec.position_embedding == "alibi" and spec.embedding_norm
