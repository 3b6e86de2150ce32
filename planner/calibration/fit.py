"""Fit a cluster's few efficiency knobs to the step times of the user's own runs.

Each run is a layout the cost model can predict (`planner.predict.predict`) and one measured
step time: one observation. Three knobs, each a factor on fields of the GPU preset's
`[efficiency]` table (planner/presets/gpus.toml), tried in this order:

  compute   gemm (or the measured GEMM table's scale), attention (FA2, FA3, cuDNN rates), hbm
            (the roofline's achieved fractions)
  comm      intra_node_comm, inter_node_comm        (achieved fractions of link bandwidth)
  overhead  kernel_overhead_us, host_op_us_*          (per-kernel launch, tail and host time)

A factor scales its fields together, so it stays within the fields' physical bounds (`BOUNDS`:
an efficiency is a fraction of peak no kernel beats and no tuned run falls far below).

With one or a few runs the problem is under-determined, so a knob is fitted only when the runs
can tell it apart (`select`): at most as many knobs as runs, and a knob only if its effect on
the runs' log step times, d ln T / d ln factor, keeps a norm of at least `MIN_SENSITIVITY`
after removing what the knobs already chosen explain (Gram-Schmidt on the sensitivity
columns). One run fixes the compute factor; runs of different layouts (one communication
bound, one compute bound) separate compute from communication.

The fitted factors minimise the mean squared log ratio of predicted to measured step time,
with the deterministic Nelder-Mead of planner/cost/calibrate.py in log space, clamped to the
bounds. Memory does not depend on these knobs: the caller reports its residual, nothing is fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.calibrate import _nelder_mead as nelder_mead
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout
from planner.predict import Prediction, predict
from planner.spec import GEMM_TABLE_FIELDS, Cluster, GpuEfficiency, ModelSpec

BOUNDS: dict[str, tuple[float, float]] = {
    "gemm": (0.3, 0.95),
    "gemm_table_scale": (0.3, 1.15),
    "attention_fwd": (0.15, 0.95),
    "attention_bwd": (0.15, 0.95),
    "hbm": (0.3, 0.95),
    "intra_node_comm": (0.3, 1.0),
    "inter_node_comm": (0.3, 1.0),
    "flash1_fwd": (0.05, 0.95),
    "flash1_bwd": (0.05, 0.95),
    "flash3_fwd": (0.15, 0.95),
    "flash3_bwd": (0.15, 0.95),
    "cudnn_fwd": (0.15, 0.95),
    "cudnn_bwd": (0.15, 0.95),
    "triton_fa1_fwd": (0.05, 0.95),
    "triton_fa1_bwd": (0.05, 0.95),
    "kernel_overhead_us": (0.5, 50.0),
    "host_op_us_forward": (1.0, 50.0),
    "host_op_us_backward": (1.0, 50.0),
}
"""Physical range of each efficiency field. Fractions of peak: the best cuBLAS GEMMs and
FlashAttention-3 kernels reach 75-85% of dense peak (Shah et al. 2024, FlashAttention-3,
table 1), STREAM-like copies 90%+ of HBM bandwidth; nccl-tests bus bandwidth reaches 80-95%
of the link rate on NVLink and InfiniBand. The lower ends are where a run is broken rather
than slow, except the FlashAttention-1-class kernels (flash1, and llm-foundry's Triton
FlashAttention triton_fa1), whose Hopper backward priors are 0.135-0.177 of peak
(presets/gpus.toml), so their ranges start at 0.05. Kernel
overhead: a CUDA launch costs ~2-5 us of host time, eager PyTorch dispatch adds tens of us
per op when the host bounds the step. `gemm_table_scale` multiplies measured GEMM rates
(planner/presets/gemm_*.toml): down to where a run is broken, up to 15 % above the measurement
(the H100 table's largest rate, 0.82 of peak, x 1.15 is gemm's 0.95)."""

KNOBS: dict[str, tuple[str, ...]] = {
    "compute": (
        "gemm",
        "gemm_table_scale",
        "attention_fwd",
        "attention_bwd",
        "flash1_fwd",
        "flash1_bwd",
        "flash3_fwd",
        "flash3_bwd",
        "cudnn_fwd",
        "cudnn_bwd",
        "triton_fa1_fwd",
        "triton_fa1_bwd",
        "hbm",
    ),
    "comm": ("intra_node_comm", "inter_node_comm"),
    "overhead": ("kernel_overhead_us", "host_op_us_forward", "host_op_us_backward"),
}
"""Each knob and the efficiency fields it scales, in the order they are tried (a field the
GPU preset leaves unset or at zero, e.g. a kernel it has no rate for, or `gemm_table_scale`
without a `gemm_table`, is left as it is)."""

MIN_SENSITIVITY = 0.05
"""Smallest norm, over the runs, of a knob's d ln(step time) / d ln(factor) left after the
knobs already chosen, for the runs to pin it down (a 5% change per e-fold of the factor)."""

_DELTA = 0.05
"""Log step of the central finite difference for the sensitivities."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured run: what it trained, how, and its steady-state step time."""

    name: str
    spec: ModelSpec
    cluster: Cluster
    layout: Layout
    global_batch: int
    seq: int
    options: CostOptions
    measured_step_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KnobResult:
    """One knob: its factor, the range it may take, and whether and why it was fitted."""

    name: str
    fields: tuple[str, ...]
    value: float
    """The factor applied to the prior values of `fields` (1.0 when not fitted)."""
    bounds: tuple[float, float]
    fitted: bool
    reason: str
    sensitivity: float
    """Norm over the runs of d ln T / d ln factor beyond the knobs chosen before it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Residual:
    """One run's predicted step time under the prior and the fitted efficiency."""

    name: str
    measured_s: float
    before_s: float
    after_s: float
    after: Prediction

    @property
    def before_pct(self) -> float:
        return 100.0 * (self.before_s / self.measured_s - 1)

    @property
    def after_pct(self) -> float:
        return 100.0 * (self.after_s / self.measured_s - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """The fitted efficiency, every knob's verdict and every run's residual."""

    prior: GpuEfficiency
    efficiency: GpuEfficiency
    knobs: tuple[KnobResult, ...]
    residuals: tuple[Residual, ...]


def knob_bounds(name: str, prior: GpuEfficiency) -> tuple[float, float]:
    """The factor range that keeps every field of knob `name` within its `BOUNDS`."""
    lows, highs = [], []
    for field in KNOBS[name]:
        value, (low, high) = getattr(prior, field), BOUNDS[field]
        if not _in_use(prior.model_dump(), field):
            continue
        lows.append(low / value)
        highs.append(high / value)
    low, high = max(lows), min(highs)
    return (min(low, 1.0), max(high, 1.0))


def apply(prior: GpuEfficiency, factors: dict[str, float], source: str = "") -> GpuEfficiency:
    """`prior` with each knob's fields multiplied by its factor."""
    fields = prior.model_dump()
    for name, factor in factors.items():
        for field in KNOBS[name]:
            if _in_use(fields, field):
                fields[field] = fields[field] * factor
    if source:
        fields["source"] = source
    return GpuEfficiency.model_construct(**fields)


def _in_use(fields: dict, field: str) -> bool:
    """Whether an efficiency field enters the cost model (set, non-zero, and for the table's
    scale, a table to scale)."""
    tables = any(fields.get(name) is not None for name in GEMM_TABLE_FIELDS)
    return bool(fields[field]) and (field != "gemm_table_scale" or tables)


def predict_run(run: Run, efficiency: GpuEfficiency) -> Prediction:
    """The cost model's prediction of `run` on its cluster with `efficiency`."""
    cluster = run.cluster.model_copy(update={"gpu": run.cluster.gpu.model_copy(update={"efficiency": efficiency})})
    return predict(CostModel(run.spec, cluster, run.options), run.layout, run.global_batch, run.seq)


def sensitivities(runs: list[Run], prior: GpuEfficiency) -> dict[str, list[float]]:
    """Per knob, d ln(step time) / d ln(factor) of each run at the prior."""
    out = {}
    for name in KNOBS:
        up, down = apply(prior, {name: math.exp(_DELTA)}), apply(prior, {name: math.exp(-_DELTA)})
        out[name] = [
            (math.log(predict_run(r, up).step_time_s) - math.log(predict_run(r, down).step_time_s)) / (2 * _DELTA)
            for r in runs
        ]
    return out


def select(columns: dict[str, list[float]], num_runs: int) -> list[tuple[str, bool, str, float]]:
    """(knob, fitted, why, sensitivity beyond the chosen knobs) for each knob, in `KNOBS` order."""
    basis: list[list[float]] = []
    chosen: list[str] = []
    out = []
    for name, column in columns.items():
        rest = list(column)
        for b in basis:
            dot = sum(x * y for x, y in zip(rest, b))
            rest = [x - dot * y for x, y in zip(rest, b)]
        norm = math.sqrt(sum(x * x for x in rest))
        if len(chosen) >= num_runs:
            give = f"{num_runs} runs give {num_runs} step times" if num_runs > 1 else "1 run gives 1 step time"
            out.append((name, False, f"not fitted: {give}, already used by {', '.join(chosen)}", norm))
        elif norm < MIN_SENSITIVITY:
            what = "beyond what " + ", ".join(chosen) + " explains" if chosen else "at all"
            out.append(
                (
                    name,
                    False,
                    f"not fitted: the runs' step times hardly depend on it {what} "
                    f"(|d ln T / d ln {name}| = {norm:.3f} < {MIN_SENSITIVITY})",
                    norm,
                )
            )
        else:
            basis.append([x / norm for x in rest])
            chosen.append(name)
            out.append(
                (
                    name,
                    True,
                    f"fitted: the runs' step times depend on it (|d ln T / d ln {name}| = "
                    f"{norm:.3f}{' beyond ' + ', '.join(chosen[:-1]) if len(chosen) > 1 else ''})",
                    norm,
                )
            )
    return out


def fit(runs: list[Run], prior: GpuEfficiency) -> FitResult:
    """The knobs the runs determine, fitted to their step times (see the module docstring)."""
    assert runs, "fit needs at least one run"
    verdicts = select(sensitivities(runs, prior), len(runs))
    names = [name for name, fitted, _, _ in verdicts if fitted]
    bounds = {name: knob_bounds(name, prior) for name in KNOBS}

    def factors(x: list[float]) -> dict[str, float]:
        return {n: min(max(math.exp(v), bounds[n][0]), bounds[n][1]) for n, v in zip(names, x)}

    def loss(x: list[float]) -> float:
        efficiency = apply(prior, factors(x))
        return sum(math.log(predict_run(r, efficiency).step_time_s / r.measured_step_time_s) ** 2 for r in runs) / len(
            runs
        )

    best = factors(nelder_mead(loss, [0.0] * len(names), step=0.3, tol=1e-14)) if names else {}
    efficiency = apply(prior, best)
    knobs = tuple(
        KnobResult(
            name=name,
            fields=KNOBS[name],
            value=best.get(name, 1.0),
            bounds=bounds[name],
            fitted=fitted,
            reason=reason + _at_bound(best.get(name), bounds[name]),
            sensitivity=norm,
        )
        for name, fitted, reason, norm in verdicts
    )
    residuals = tuple(
        Residual(
            name=r.name,
            measured_s=r.measured_step_time_s,
            before_s=predict_run(r, prior).step_time_s,
            after_s=(after := predict_run(r, efficiency)).step_time_s,
            after=after,
        )
        for r in runs
    )
    return FitResult(prior=prior, efficiency=efficiency, knobs=knobs, residuals=residuals)


def _at_bound(value: float | None, bounds: tuple[float, float]) -> str:
    if value is None:
        return ""
    if math.isclose(value, bounds[0], rel_tol=1e-6) or math.isclose(value, bounds[1], rel_tol=1e-6):
        return "; stopped at its physical bound: the model misses something the knob cannot explain"
    return ""
