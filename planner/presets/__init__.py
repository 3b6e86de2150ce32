"""Built-in model and GPU presets, as TOML data files read by planner.catalog, and the measured
tables (GEMM, attention) the GPU presets name."""

from __future__ import annotations

from importlib import resources

from planner.errors import ConfigError


def read_table(file_name: str, kind: str) -> str:
    """The text of the data file planner/presets/`file_name`, a `kind` table a GPU preset names
    (ConfigError when there is no such file)."""
    try:
        return resources.files(__name__).joinpath(file_name).read_text()
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise ConfigError(f"{kind} table '{file_name}' is not a file in planner/presets") from exc
