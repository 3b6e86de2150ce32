"""How sure a prediction is: a step-time interval from the residuals of comparable runs, and
the memory headroom plans keep for the model's largest memory under-prediction.

The development set (tests/bench/published_runs.toml) gives each published run's step error
e = predicted / measured - 1. For a new prediction p, a run like it measured p / (1 + e); over
the comparable runs' errors that is the interval [p / (1 + max e), p / (1 + min e)].
Comparable means, in this order of preference, the same kind of model (dense or mixture of
experts), runtime, GPU generation and scale band (GPUs up to 64, up to 1,024, more); when fewer
than `MIN_RUNS` runs match, the scale band, then the GPU generation, then the runtime, then the
kind of model is dropped. The development set's rows were examined while the model was built,
so its errors are smaller than on runs it never saw (docs/accuracy_preregistered.md): the
interval is the spread of comparable development runs, not a confidence bound. With a calibration file the interval comes
from the fit's own residuals on the user's runs instead.

The default memory headroom is the largest share by which the development set's predicted
peak memory fell short of the published one (-e for the most negative memory error e): a plan
held to (1 - h) of the memory would have fitted every development run that published memory.

planner/presets/residuals.json holds the development set's residuals; `python
tests/bench/published_runs.py --residuals` writes it, and a test checks it against a fresh
evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict

MIN_RUNS = 5
"""Fewest comparable runs an interval is drawn from."""
SCALE_BANDS = (64, 1024)
"""Upper GPU counts of the scale bands (the last band is open)."""


class Residual(BaseModel):
    """One development run's step error and what makes runs comparable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    runtime: str
    """The runtime's name, without its version."""
    gpu_generation: str
    gpus: int
    moe: bool
    """A mixture-of-experts model."""
    step_error: float
    memory_error: float | None = None
    """Predicted over published peak memory, minus one (None: the run published none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """The step time a run like the prediction's measured, low and high, and what it rests on."""

    low_s: float
    high_s: float
    runs: int
    basis: str


def gpu_generation(gpu: str) -> str:
    """'h100' for h100, h100-96gb and h800 alike: the preset's family before its variant."""
    name = gpu.split("-")[0]
    return {"h800": "h100", "h200": "h100"}.get(name, name)


def scale_band(gpus: int) -> int:
    """The index of the scale band `gpus` falls in."""
    return next((i for i, top in enumerate(SCALE_BANDS) if gpus <= top), len(SCALE_BANDS))


def band_text(band: int) -> str:
    """'65-1,024 GPUs' for a scale band."""
    low = 1 if band == 0 else SCALE_BANDS[band - 1] + 1
    return f"{low:,}-{SCALE_BANDS[band]:,} GPUs" if band < len(SCALE_BANDS) else f"over {low - 1:,} GPUs"


@cache
def development_residuals() -> tuple[Residual, ...]:
    """The shipped residuals of the development set."""
    text = resources.files("planner.presets").joinpath("residuals.json").read_text()
    return tuple(Residual(**row) for row in json.loads(text)["runs"])


def comparable(
    residuals: tuple[Residual, ...], runtime: str | None, gpu: str, gpus: int, moe: bool
) -> tuple[list[Residual], str]:
    """The residuals of the runs most like (model kind, runtime, GPU, GPU count), at least
    `MIN_RUNS` of them where the set allows, and a description of what they share (saying so
    where no run of the set was on the GPU's generation)."""
    family = (runtime or "megatron").partition("@")[0]
    generation, band, kind = gpu_generation(gpu), scale_band(gpus), "MoE" if moe else "dense"
    tiers: tuple[tuple[Callable[[Residual], bool], str], ...] = (
        (
            lambda r: (
                r.moe == moe and r.runtime == family and r.gpu_generation == generation and scale_band(r.gpus) == band
            ),
            f"{kind}, {family} on {generation}, {band_text(band)}",
        ),
        (
            lambda r: r.moe == moe and r.runtime == family and r.gpu_generation == generation,
            f"{kind}, {family} on {generation}",
        ),
        (lambda r: r.moe == moe and r.runtime == family, f"{kind}, {family}"),
        (lambda r: r.moe == moe, f"{kind}, all runtimes"),
        (lambda r: True, "all runs"),
    )
    unseen = "" if any(r.gpu_generation == generation for r in residuals) else f"; none on {generation}"
    for keep, basis in tiers:
        chosen = [r for r in residuals if keep(r)]
        if len(chosen) >= MIN_RUNS:
            return chosen, basis + unseen
    return list(residuals), "all runs" + unseen


def interval_from_errors(step_time_s: float, errors: list[float], basis: str) -> Interval:
    """The interval of `step_time_s` under these step errors (predicted / measured - 1)."""
    return Interval(
        low_s=step_time_s / (1 + max(errors)), high_s=step_time_s / (1 + min(errors)), runs=len(errors), basis=basis
    )


def step_interval(step_time_s: float, runtime: str | None, gpu: str, gpus: int, moe: bool) -> Interval:
    """The interval of a prediction from the development set's comparable runs."""
    chosen, basis = comparable(development_residuals(), runtime, gpu, gpus, moe)
    return interval_from_errors(step_time_s, [r.step_error for r in chosen], f"{len(chosen)} published runs: {basis}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Headroom:
    """The share of the memory limit plans keep free by default, and what it rests on."""

    share: float
    runs: int
    """Development runs that published their peak memory."""
    worst_run: str


@cache
def default_memory_headroom() -> Headroom:
    """The development set's largest memory under-prediction, as a share of the measured peak."""
    published = [r for r in development_residuals() if r.memory_error is not None]
    if not published:
        return Headroom(share=0.0, runs=0, worst_run="none")
    worst = min(published, key=lambda r: r.memory_error or 0.0)
    share = max(0.0, -(worst.memory_error or 0.0))
    return Headroom(share=round(share, 3), runs=len(published), worst_run=worst.name)
