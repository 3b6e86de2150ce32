"""Built-in presets (package data files) and resolution of `--model` / `--gpu` arguments,
each either a preset name or a path to a file."""

from __future__ import annotations

import json
import os
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import ConfigError, UnknownPresetError
from planner.spec import GpuSpec, ModelSpec, model_from_hf_config, validation_message


@cache
def _preset_table(file_name: str) -> dict[str, dict[str, Any]]:
    text = resources.files("planner.presets").joinpath(file_name).read_text()
    return tomllib.loads(text)


@cache
def model_presets() -> dict[str, ModelSpec]:
    """Every built-in model, by name."""
    return {name: ModelSpec(name=name, **fields) for name, fields in _preset_table("models.toml").items()}


@cache
def gpu_presets() -> dict[str, GpuSpec]:
    """Every built-in accelerator, by name."""
    return {name: GpuSpec(name=name, **fields) for name, fields in _preset_table("gpus.toml").items()}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a model read from a file: a Hugging Face `config.json` (or the
    folder holding one, as a Hugging Face checkpoint does), or a planner ModelSpec in JSON or TOML."""
    presets = model_presets()
    if name_or_path in presets:
        return presets[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        path = _config_in_folder(path)
    if not path.is_file():
        raise UnknownPresetError(
            f"unknown model '{name_or_path}': not a preset ({', '.join(presets)}), "
            "a config file or a folder holding config.json"
        )
    data = _read_mapping(path)
    label = path.stem if path.name != "config.json" else Path(os.path.abspath(path)).parent.name or path.stem
    if "family" in data:
        try:
            return ModelSpec(**{"name": label, **data})
        except ValidationError as exc:
            raise ConfigError(validation_message(exc, f"model config {path}")) from None
    return model_from_hf_config(data, name=label)


def resolve_gpu(name: str) -> GpuSpec:
    """A built-in GPU preset by name (case-insensitive)."""
    presets = gpu_presets()
    key = name.lower()
    if key not in presets:
        raise UnknownPresetError(f"unknown GPU '{name}': choose one of {', '.join(presets)}")
    return presets[key]


def _config_in_folder(folder: Path) -> Path:
    """The config.json of a model folder; ConfigError when it has none."""
    config = folder / "config.json"
    if not config.is_file():
        raise ConfigError(f"model folder {folder} holds no config.json")
    return config


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object at the top level")
    return data
