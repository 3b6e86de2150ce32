"""How much the published runs' step errors move when one global factor of the cost model
moves within its stated range.

The factors and their ranges are data (planner/presets/factor_ranges.toml, one table per factor
and GPU family). A factor's `field` is either `efficiency.NAME`, a GPU preset field: the runs
on the presets it applies to are evaluated on a copy of their GPU spec with that field changed
(and the fields in `also_scales`, which carry the same factor, scaled by the same ratio); or
`options.NAME`, a cost option set in every run's settings as `--set NAME=VALUE` sets it. Either
way each run goes through `planner.fidelity.published.evaluate_run`, the path of `planner
evaluate`, with everything else as it is.

Pure: `load_factor_ranges` is the only function that reads a file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.catalog import resolve_gpu
from planner.fidelity.published import (
    ErrorSummary,
    PublishedRun,
    RunResult,
    evaluate_run,
    load_tables,
    summarize,
)
from planner.spec import GpuEfficiency, GpuSpec

RANGES_FILE = Path(__file__).parents[1] / "presets" / "factor_ranges.toml"

Value = bool | float | str
Position = Literal["measurement", "middle", "low end", "high end", "no range stated"]
ALL_PRESETS = "all"
"""`applies_to` of a cost option: every run, whatever its GPU."""


class FactorRange(BaseModel):
    """One [[factor]] table of factor_ranges.toml (see the file's header for every field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    applies_to: tuple[str, ...] = Field(min_length=1)
    field: str = Field(pattern=r"^(efficiency|options)\.[a-z0-9_]+$")
    also_scales: tuple[str, ...] = ()
    default: Value
    low: Value
    high: Value
    position: Position
    measured_on: tuple[str, ...] = ()
    source: str = Field(min_length=10)
    note: str = ""
    concerns: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> FactorRange:
        if self.is_option != (self.applies_to == (ALL_PRESETS,)):
            raise ValueError(f"{self.label}: a cost option applies to {ALL_PRESETS!r}, a GPU field to named presets")
        if self.also_scales and (self.is_option or not all(f.startswith("efficiency.") for f in self.also_scales)):
            raise ValueError(f"{self.label}: also_scales names efficiency fields of a GPU field's presets")
        if not self.has_range and self.position not in ("measurement", "no range stated"):
            raise ValueError(f"{self.label}: low = high, so position is 'measurement' or 'no range stated'")
        return self

    @property
    def label(self) -> str:
        """The factor and the presets it applies to, as a table row names it."""
        return f"{self.name} ({', '.join(self.applies_to)})"

    @property
    def is_option(self) -> bool:
        return self.field.startswith("options.")

    @property
    def attribute(self) -> str:
        """The field's name in GpuEfficiency or CostOptions."""
        return self.field.partition(".")[2]

    @property
    def has_range(self) -> bool:
        return self.low != self.high

    def contains_default(self) -> bool:
        """The default lies within [low, high] (a named choice: it is one of the ends)."""
        if all(isinstance(v, float) and not isinstance(v, bool) for v in (self.default, self.low, self.high)):
            return self.low <= self.default <= self.high
        return self.default in (self.low, self.high)

    def acts_on(self, run: PublishedRun) -> bool:
        """Whether moving the factor can change `run`'s prediction."""
        return self.is_option or run.gpu in self.applies_to


def load_factor_ranges(path: Path = RANGES_FILE) -> list[FactorRange]:
    """Every [[factor]] table of a factor-ranges TOML file."""
    return load_tables(path, "factor", FactorRange, "factor ranges")


def gpu_with(gpu: GpuSpec, factor: FactorRange, value: float) -> GpuSpec:
    """`gpu` with the factor's efficiency field at `value` and each field of `also_scales` (those
    the preset has) times value / default."""
    efficiency = gpu.efficiency
    changes: dict[str, float] = {factor.attribute: value}
    for field in factor.also_scales:
        name = field.partition(".")[2]
        current = getattr(efficiency, name)
        if current is not None:
            changes[name] = current * value / factor.default
    return gpu.model_copy(update={"efficiency": GpuEfficiency(**{**efficiency.model_dump(), **changes})})


def result_with(run: PublishedRun, factor: FactorRange, value: Value) -> RunResult:
    """`run` evaluated with `factor` at `value` (as it is where the factor does not act on it)."""
    if factor.is_option:
        return evaluate_run(run.model_copy(update={"settings": {**run.settings, factor.attribute: value}}))
    if run.gpu not in factor.applies_to:
        return evaluate_run(run)
    return evaluate_run(run, gpu_with(resolve_gpu(run.gpu), factor, value))


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """The published set's step errors with one factor at its low end, its default and its high end."""

    factor: FactorRange
    at_low: ErrorSummary
    at_default: ErrorSummary
    at_high: ErrorSummary
    moved: tuple[ErrorSummary, ErrorSummary, ErrorSummary] | None
    """The same at low, default and high over the runs whose predicted step time differs from
    the default's at either end (None: no run moves)."""

    @property
    def runs_moved(self) -> int:
        return self.moved[0].runs if self.moved else 0


def sensitivity(
    runs: list[PublishedRun], factors: list[FactorRange], progress: Callable[[str], None] | None = None
) -> list[Sensitivity]:
    """For each factor, the runs' errors at its low and its high end, everything else at the
    defaults (a factor with no stated range: the defaults' errors at both ends)."""
    defaults = [evaluate_run(run) for run in runs]
    base = summarize(defaults)
    rows = []
    for i, factor in enumerate(factors, 1):
        if progress:
            progress(f"[{i}/{len(factors)}] {factor.label}")
        if not factor.has_range:
            rows.append(Sensitivity(factor=factor, at_low=base, at_default=base, at_high=base, moved=None))
            continue
        low, high = (
            [
                result_with(run, factor, value) if factor.acts_on(run) else default
                for run, default in zip(runs, defaults)
            ]
            for value in (factor.low, factor.high)
        )
        moved = [
            k
            for k, d in enumerate(defaults)
            if any(end[k].predicted_step_time_s != d.predicted_step_time_s for end in (low, high))
        ]
        subset = tuple(summarize([results[k] for k in moved]) for results in (low, defaults, high)) if moved else None
        rows.append(
            Sensitivity(factor=factor, at_low=summarize(low), at_default=base, at_high=summarize(high), moved=subset)
        )
    return rows


def _value_text(value: Value) -> str:
    return f"{value:.4g}" if isinstance(value, float) and not isinstance(value, bool) else str(value).lower()


def _errors_text(ends: tuple[ErrorSummary, ...]) -> str:
    """Mean |step error| and mean signed step error at low / default / high."""
    return " / ".join(f"{s.mean_abs:.2%}" for s in ends) + " | " + " / ".join(f"{s.mean_signed:+.2%}" for s in ends)


def sensitivity_markdown(rows: list[Sensitivity]) -> str:
    """One Markdown table: each factor's range, and the mean |step error| and mean signed step
    error at its low end, default and high end, over all runs and over the runs it moves."""
    header = (
        "| factor | low | default | high | all runs: mean abs step error, low / default / high | mean signed "
        "| runs moved | moved runs: mean abs step error, low / default / high | mean signed |"
    )
    lines = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        f = row.factor
        values = " | ".join(_value_text(v) for v in (f.low, f.default, f.high))
        moved = _errors_text(row.moved) if row.moved else "- | -"
        count = row.runs_moved if f.has_range else "no range"
        lines.append(
            f"| {f.label} | {values} | {_errors_text((row.at_low, row.at_default, row.at_high))} | {count} | {moved} |"
        )
    return "\n".join(lines) + "\n"
