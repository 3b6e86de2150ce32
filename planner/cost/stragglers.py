"""Stragglers from GPU-to-GPU speed variability: a synchronous step waits for its slowest GPU.

GPUs of one SKU run the same compute-bound kernel at different speeds (manufacturing spread
of each die's voltage-frequency curve under the board's power limit; docs/stragglers.md). A
training step couples every GPU of the job through its TP, PP and DP collectives, so its
compute advances at the pace of the slowest one. With per-GPU times t drawn independently from
a measured population, a job on N GPUs is slowed, in expectation over the GPUs it lands on, by

    slowdown(N) = E[max(t_1 .. t_N)] / E[t]

(1 for one GPU, growing with N). The population is a measured sample of n per-GPU times
(a `SpeedSpread`), so E[max] over N draws from it is exact:

    E[max] = sum_k t_(k) ((k / n)^N - ((k - 1) / n)^N)      (t_(1) <= .. <= t_(n))

The sample's gross outliers (a broken or misconfigured node that operators take out of
service) are dropped before, at Tukey's far-out fence Q3 + 3 IQR; `gross_outlier_fence`
names the rule in the data file.

Data: planner/presets/gpu_speed_spread.toml (each population with its source), or a file in
the same format that scripts/measure_gpu_speed.py writes from the user's own cluster.
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from planner.errors import ConfigError

SPREAD_FILE = "gpu_speed_spread.toml"
"""Built-in per-GPU speed populations, in planner/presets."""

FAR_OUT_FENCE_IQR = 3.0
"""Tukey's far-out fence: a time above Q3 + 3 IQR is a gross outlier (Tukey 1977, EDA)."""


@dataclass(frozen=True, slots=True)
class SpeedSpread:
    """A measured population of per-GPU compute times of one benchmark, each relative to the
    population's median, gross outliers removed."""

    name: str
    times: tuple[float, ...]
    """Per-GPU time relative to the median, ascending."""
    dropped: int
    """GPUs of the measured sample beyond the far-out fence."""
    source: str

    def slowdown(self, num_gpus: int) -> float:
        """Expected compute slowdown of a job on `num_gpus` GPUs drawn from this population."""
        return expected_slowest(self.times, num_gpus)


def far_out_trimmed(times: Sequence[float], fence_iqr: float = FAR_OUT_FENCE_IQR) -> tuple[tuple[float, ...], int]:
    """`times` ascending without those above Q3 + fence_iqr * IQR, and how many were dropped."""
    if len(times) < 4:
        return tuple(sorted(times)), 0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    fence = q3 + fence_iqr * (q3 - q1)
    kept = tuple(sorted(t for t in times if t <= fence))
    return kept, len(times) - len(kept)


def expected_slowest(times: Sequence[float], num_gpus: int) -> float:
    """E[max of `num_gpus` independent draws from `times`] over E[one draw]: the slowdown of a
    step that waits for the slowest of `num_gpus` GPUs (exact for the empirical distribution)."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    ordered = sorted(times)
    n = len(ordered)
    if n == 0:
        raise ValueError("a speed spread needs at least one time")
    expected_max = sum(t * (((k + 1) / n) ** num_gpus - (k / n) ** num_gpus) for k, t in enumerate(ordered))
    return expected_max / (sum(ordered) / n)


def spread_from_toml(name: str, table: dict) -> SpeedSpread:
    """One population from its TOML table: `times` (per GPU, any unit), `source`, and
    optionally `gross_outlier_fence_iqr` (default Tukey's far-out 3)."""
    try:
        raw = [float(t) for t in table["times"]]
        source = str(table["source"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"speed spread '{name}' needs `times` (numbers) and `source`: {exc}") from exc
    if not raw or min(raw) <= 0:
        raise ConfigError(f"speed spread '{name}': `times` must be positive and not empty")
    median = statistics.median(raw)
    kept, dropped = far_out_trimmed(
        [t / median for t in raw], float(table.get("gross_outlier_fence_iqr", FAR_OUT_FENCE_IQR))
    )
    return SpeedSpread(name=name, times=kept, dropped=dropped, source=source)


@cache
def builtin_spreads() -> dict[str, SpeedSpread]:
    """The populations in planner/presets/gpu_speed_spread.toml, by name."""
    data = tomllib.loads(resources.files("planner.presets").joinpath(SPREAD_FILE).read_text())
    return {name: spread_from_toml(name, table) for name, table in data.items()}


@cache
def load_speed_spread(name_or_path: str) -> SpeedSpread:
    """A built-in population by name, or the one population in a TOML file (the format
    scripts/measure_gpu_speed.py writes)."""
    builtin = builtin_spreads()
    if name_or_path in builtin:
        return builtin[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"unknown GPU speed spread '{name_or_path}': neither a built-in one "
            f"({', '.join(sorted(builtin))}) nor a file"
        )
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read GPU speed spread {path}: {exc}") from exc
    if len(data) != 1 or not isinstance(next(iter(data.values())), dict):
        raise ConfigError(f"{path} must hold exactly one [name] table with `times` and `source`")
    name, table = next(iter(data.items()))
    return spread_from_toml(name, table)


@cache
def straggler_slowdown(spread: str | None, num_gpus: int) -> float:
    """Compute slowdown of a job on `num_gpus` GPUs from population `spread` (1 without one)."""
    if spread is None or num_gpus == 1:
        return 1.0
    return load_speed_spread(spread).slowdown(num_gpus)
