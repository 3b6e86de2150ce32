"""Fit the analytic compute model's efficiencies to measured profiles.

The analytic model (planner/cost/compute.py) predicts a layer's forward, backward-input (I)
and backward-weight (W) time from its work and six per-GPU numbers: `gemm`,
`gemm_half_dim`, `attention_fwd`, `attention_bwd`, `hbm` and `kernel_overhead_us`. Given
profiles measured on one device, `fit` chooses them to minimise the mean squared log ratio

    mean over rows and parts of  log(predicted / measured) ** 2

over forward, I and W of every "ok" row without recomputation (the embedding, whose I is
empty by construction, contributes forward and its whole backward). Minimisation is a
deterministic Nelder-Mead simplex in log space, restarted from its best point until it
stops improving, started from the preset's values rescaled so that the mean log ratio is
zero (scaling every efficiency by a and the overhead by 1/a scales every time by 1/a).
Only the efficiencies the samples depend on move (`identified`: a profile of embeddings
alone fits HBM and overhead); the others keep that common rescaling, which assumes the
measured device is as much slower or faster on them. Efficiencies are capped at 1; the fit reports the mean absolute percentage error before
and after. Communication efficiencies are not fitted (profiles time compute only).

Efficiencies are fractions of the datasheet peak, so a fit transfers to another GPU of
the same software stack as is (`transfer`): its times then scale with that GPU's peak
FLOP/s and HBM bandwidth.

`plan --profile` fills the shapes a profile does not span with the analytic model fitted
to that profile: `fit_file` caches the fit per profile file (path, size, modification time)
and GPU for the process, and `fitted_gpu` carries it into the GPU preset the cost model
runs on, at the plan's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from planner.cost.compute import AnalyticCompute, LayerTimes
from planner.cost.shapes import LayerWork, Shard, layer_work
from planner.errors import PlannerError
from planner.profile.schema import Profile
from planner.spec import GEMM_TABLE_FIELDS, GpuEfficiency, GpuSpec

_PEAK_FRACTIONS = ("gemm", "attention_fwd", "attention_bwd")
"""Efficiencies that are fractions of the dtype's peak FLOP/s (hbm is of the bandwidth)."""

FITTED = ("gemm", "gemm_half_dim", "attention_fwd", "attention_bwd", "hbm", "kernel_overhead_us")
_FRACTIONS = {"gemm", "attention_fwd", "attention_bwd", "hbm"}
_FIT_UNDER = {"sustained_compute", "sustained_compute_source"}
"""Fields the fitted fractions were fitted under (they multiply them): they travel with them."""
_MIN_OVERHEAD_US = 1e-3
_MAX_LOG = 200.0
PARTS = ("forward", "backward_input", "backward_weight", "backward")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One measured time to fit: a part of one profile row."""

    kind: str
    part: str
    """"forward", "backward_input", "backward_weight", or "backward" (I + W)."""
    dtype: str
    work: LayerWork
    measured_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PartError:
    """Mean absolute percentage error of one kind's part, before and after the fit."""

    kind: str
    part: str
    count: int
    before_pct: float
    after_pct: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A fitted efficiency and how well the model matches the profiles with it."""

    efficiency: GpuEfficiency
    before_pct: float
    after_pct: float
    parts: tuple[PartError, ...]
    num_samples: int


def samples(profiles: list[Profile]) -> list[Sample]:
    """Every fittable time in `profiles` (ok rows, no recomputation)."""
    out = []
    for profile in profiles:
        for row in profile.rows:
            if row.status != "ok" or row.recompute != "none":
                continue
            work = layer_work(profile.model, row.kind, Shard(mbs=row.mbs, seq=row.seq, tp=row.tp))
            measured = {
                "forward": row.forward_ms,
                "backward_input": row.backward_input_ms,
                "backward_weight": row.backward_weight_ms,
            }
            if row.kind == "embedding":
                measured = {"forward": row.forward_ms, "backward": row.backward_input_ms + row.backward_weight_ms}
            for part, ms in measured.items():
                if ms > 0:
                    out.append(Sample(kind=row.kind, part=part, dtype=profile.dtype, work=work, measured_s=ms / 1e3))
    return out


def predict(items: list[Sample], gpu: GpuSpec, efficiency: GpuEfficiency) -> list[float]:
    """The analytic model's seconds for each sample under `efficiency`."""
    computes: dict[str, AnalyticCompute] = {}
    out = []
    for s in items:
        compute = computes.get(s.dtype) or computes.setdefault(s.dtype, AnalyticCompute(gpu, s.dtype, efficiency))
        out.append(_part(compute.layer_times(s.work), s.part))
    return out


def _part(times: LayerTimes, part: str) -> float:
    if part == "backward":
        return times.backward_s
    return {
        "forward": times.forward_s,
        "backward_input": times.backward_input_s,
        "backward_weight": times.backward_weight_s,
    }[part]


def fit(profiles: list[Profile], gpu: GpuSpec, source: str = "") -> Calibration:
    """The efficiency of `gpu` that best matches `profiles` (see the module docstring)."""
    devices = {p.device for p in profiles}
    if len(devices) > 1:
        raise PlannerError(f"calibrate profiles of one device at a time; got {', '.join(sorted(devices))}")
    for p in profiles:
        gpu.peak_flops(p.dtype)  # ConfigError when the GPU has no such peak
    items = samples(profiles)
    if not items:
        raise PlannerError("the profiles have no successful measurements to calibrate on")
    prior = gpu.efficiency
    free_names = identified(items)
    # a fit of gemm/gemm_half_dim replaces the measured GEMM table: their functional form is what it fits
    no_tables = dict.fromkeys(GEMM_TABLE_FIELDS)
    fitted_prior = prior.model_copy(update=no_tables) if "gemm" in free_names else prior

    start = _encode(fitted_prior)
    shift = sum(math.log(p / s.measured_s) for p, s in zip(predict(items, gpu, fitted_prior), items)) / len(items)
    start = [
        v + (shift if name in _FRACTIONS else -shift if name == "kernel_overhead_us" else 0.0)
        for name, v in zip(FITTED, start)
    ]
    free = [i for i, name in enumerate(FITTED) if name in free_names]

    def point(y: list[float]) -> list[float]:
        x = list(start)
        for i, value in zip(free, y):
            x[i] = value
        return x

    def loss(y: list[float]) -> float:
        predicted = predict(items, gpu, _decode(point(y), fitted_prior))
        return sum(math.log(p / s.measured_s) ** 2 for p, s in zip(predicted, items)) / len(items)

    best = point(_nelder_mead(loss, [start[i] for i in free]))
    fields = {**fitted_prior.model_dump(), **_decode(best, fitted_prior).model_dump(include=set(FITTED))}
    fields["source"] = source or "fitted by planner calibrate"
    efficiency = GpuEfficiency(**fields)
    before, after = predict(items, gpu, prior), predict(items, gpu, efficiency)
    return Calibration(
        efficiency=efficiency,
        before_pct=_mape(before, items),
        after_pct=_mape(after, items),
        parts=_part_errors(items, before, after),
        num_samples=len(items),
    )


def identified(items: list[Sample]) -> set[str]:
    """The efficiencies the samples' work depends on: GEMM terms only with GEMMs, each
    attention term only with that pass of an attention core; HBM and kernel overhead always."""
    names = {"hbm", "kernel_overhead_us"}
    if any(s.work.gemms for s in items):
        names |= {"gemm", "gemm_half_dim"}
    if any(s.work.attention_flops > 0 and s.part == "forward" for s in items):
        names.add("attention_fwd")
    if any(s.work.attention_flops > 0 and s.part in ("backward_input", "backward") for s in items):
        names.add("attention_bwd")
    return names


def transfer(efficiency: GpuEfficiency, target: GpuSpec, source: str = "") -> GpuEfficiency:
    """`efficiency` (fitted on one GPU) for `target`: the fractions of peak and the
    shape/overhead terms carry over unchanged, the target keeps its own (unfitted)
    communication efficiencies. Its GEMMs follow the fitted `gemm`/`gemm_half_dim` (the
    target's measured GEMM table is dropped) unless `efficiency` itself runs on a table."""
    fields = {**target.efficiency.model_dump(), **efficiency.model_dump(include=set(FITTED) | _FIT_UNDER)}
    if efficiency.gemm_table is None:
        fields.update(dict.fromkeys(GEMM_TABLE_FIELDS))
    fields["source"] = source or f"transferred as fractions of peak ({efficiency.source})"
    return GpuEfficiency(**fields)


_FITS: dict[tuple[str, int, int, str], Calibration] = {}


def fit_file(path: Path, profile: Profile, gpu: GpuSpec) -> Calibration:
    """`fit([profile], gpu)` for the profile read from `path`, computed once per file
    version (path, size, modification time) and GPU in this process."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, gpu.model_dump_json())
    if key not in _FITS:
        _FITS[key] = fit([profile], gpu, source=f"fitted to profile {path.name} by planner")
    return _FITS[key]


def fitted_gpu(gpu: GpuSpec, efficiency: GpuEfficiency, profile_dtype: str, dtype: str) -> GpuSpec:
    """`gpu` with the fitted compute efficiencies (its own communication ones), so that the
    analytic model at `dtype` reproduces the times the fit saw at `profile_dtype`: the
    FLOP/s fractions are rescaled by the ratio of the two peaks (capped at 1), as measured
    times are used whatever dtype is planned."""
    ratio = gpu.peak_flops(profile_dtype) / gpu.peak_flops(dtype)
    fields = {**gpu.efficiency.model_dump(), **efficiency.model_dump(include={*FITTED, *GEMM_TABLE_FIELDS})}
    for name in _PEAK_FRACTIONS:
        fields[name] = min(1.0, fields[name] * ratio)
    fields["source"] = efficiency.source
    return gpu.model_copy(update={"efficiency": GpuEfficiency(**fields)})


def _encode(eff: GpuEfficiency) -> list[float]:
    return [math.log(max(getattr(eff, name), _MIN_OVERHEAD_US)) for name in FITTED]


def _decode(x: list[float], prior: GpuEfficiency) -> GpuEfficiency:
    fields = prior.model_dump()
    for name, value in zip(FITTED, x):
        value = math.exp(min(value, _MAX_LOG))  # a simplex step far out stays a (huge) number
        fields[name] = min(1.0, value) if name in _FRACTIONS else value
    return GpuEfficiency.model_construct(**fields)


def _mape(predicted: list[float], items: list[Sample]) -> float:
    return 100.0 * sum(abs(p / s.measured_s - 1) for p, s in zip(predicted, items)) / len(items)


def _part_errors(items: list[Sample], before: list[float], after: list[float]) -> tuple[PartError, ...]:
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(items):
        groups.setdefault((s.kind, s.part), []).append(i)
    order = {"embedding": 0, "transformer": 1, "head": 2}
    return tuple(
        PartError(
            kind=kind,
            part=part,
            count=len(idx),
            before_pct=_mape([before[i] for i in idx], [items[i] for i in idx]),
            after_pct=_mape([after[i] for i in idx], [items[i] for i in idx]),
        )
        for (kind, part), idx in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 9), PARTS.index(kv[0][1])))
    )


def _nelder_mead(
    f, x0: list[float], step: float = 0.4, tol: float = 1e-12, max_evals: int = 4000, restarts: int = 8
) -> list[float]:
    """Minimise f from x0: Nelder-Mead (reflect 1, expand 2, contract 1/2, shrink 1/2),
    restarted from the best point while a restart still improves f by more than tol."""
    best, best_f = list(x0), f(x0)
    evals = 1
    for _ in range(restarts):
        point, value, used = _simplex_run(f, best, step, tol, max_evals - evals)
        evals += used
        improved = best_f - value > tol
        if value < best_f:
            best, best_f = point, value
        if not improved or evals >= max_evals:
            break
    return best


def _simplex_run(f, x0: list[float], step: float, tol: float, budget: int) -> tuple[list[float], float, int]:
    n = len(x0)
    simplex = [list(x0)] + [[v + (step if j == i else 0.0) for j, v in enumerate(x0)] for i in range(n)]
    values = [f(p) for p in simplex]
    used = n + 1
    while used < budget:
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= tol * (1 + abs(values[0])):
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(reflected)
        used += 1
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(expanded)
            used += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = fr >= values[-1]
            target = worst if inside else reflected
            contracted = [c + 0.5 * (t - c) for c, t in zip(centroid, target)]
            fc = f(contracted)
            used += 1
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q)] for q in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
                used += n
    i = min(range(n + 1), key=values.__getitem__)
    return simplex[i], values[i], used
