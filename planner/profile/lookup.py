"""Layer times and activation memory from a measured profile, for shapes between the
measured ones: the `ComputeSource` the cost model uses with `--profile FILE`.

A query shard (kind, tp, mbs, seq, cp) is answered from the rows of the same kind and tp
with status "ok". Its coordinates are the tokens per micro-batch on one GPU,
T = mbs * seq / cp, and the attention length s = seq (a context-parallel shard attends
its local queries to all seq keys, so at a fixed s time grows with T as it does with mbs).
The rows of each measured sequence length form a line over T:

  * along a line, values are interpolated log-log between the two measured points that
    bracket T (a power law through them: exact at measured points, monotone between
    monotone measurements);
  * between lines, the two lines bracketing s are evaluated at the same sequences per
    micro-batch (T / s) and interpolated log-log in s.

Outside the measured range a line is extended from its nearest point with the log-log
slope of its nearest segment clamped to [0, 1] (times grow at most in proportion to
tokens; a line of one point grows in proportion), and s beyond the measured lengths with
the slope between the two nearest lines clamped to [1, 2] (at a fixed micro-batch, GEMMs
grow with s and attention with s squared; with one length measured, its line is read at
T). Extension is refused, with a PlannerError naming the shape and the measured range,
beyond EXTRAPOLATION_FACTOR times the range in T or in s.

Profiles measure without sequence parallelism; under it the times are taken as measured
and `activation_bytes` returns None (the analytic model knows how SP splits activations).

`MeasuredFirst` is what `plan --profile` uses: a shard the profile spans without
extrapolating (a measured shape, or one between measured shapes) is measured; any other
takes its times from a fallback, the analytic model calibrated on the profile. The
embedding and the head have no attention, so under context parallelism they are looked up
at the sequence shard they see (seq / cp tokens per sequence).
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from planner.cost.compute import LayerTimes
from planner.cost.shapes import Shard
from planner.errors import ConfigError, PlannerError
from planner.plan import CostSourceName
from planner.profile import store
from planner.profile.schema import LayerRow, Profile
from planner.spec import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from planner.cost.calibrate import Calibration
    from planner.cost.model import ComputeSource

EXTRAPOLATION_FACTOR = 2.0
"""How far beyond the measured tokens per micro-batch, or sequence lengths, a lookup may go."""

_SHAPE_EXEMPT = {"name", "source", "published_params"}
log = logging.getLogger(__name__)

Point = tuple[float, tuple[float, ...]]


class _OutOfRange(Exception):
    def __init__(self, detail: str):
        self.detail = detail


class ProfiledCompute:
    """Layer times and activation bytes from a profile (a `ComputeSource`)."""

    def __init__(self, profile: Profile, name: str):
        self.profile = profile
        self.name = name
        self._rows: dict[tuple[str, int, str], list[LayerRow]] = defaultdict(list)
        self._failed: dict[tuple[str, int, str], list[LayerRow]] = defaultdict(list)
        for row in profile.rows:
            target = self._rows if row.status == "ok" else self._failed
            target[(row.kind, row.tp, row.recompute)].append(row)

    def layer_times(self, kind: str, shard: Shard) -> LayerTimes:
        """Forward / backward-input / backward-weight seconds of `kind` at `shard`."""
        rows = self._rows_for(kind, shard.tp, "none")
        if not rows:
            measured = sorted({tp for (k, tp, rc) in self._rows if k == kind and rc == "none"})
            raise PlannerError(
                f"{self.name} has no {kind} measurements at tp={shard.tp} "
                f"(measured tp: {', '.join(map(str, measured)) or 'none'}); "
                f"profile it with --tp {shard.tp}"
            )
        forward, backward_input, backward_weight = self._lookup(
            kind,
            shard,
            "none",
            rows,
            lambda r: (r.forward_ms, r.backward_input_ms, r.backward_weight_ms),
        )
        return LayerTimes(
            forward_s=forward / 1e3,
            backward_input_s=backward_input / 1e3,
            backward_weight_s=backward_weight / 1e3,
        )

    def activation_bytes(self, kind: str, shard: Shard, recompute: str = "none") -> float | None:
        """Bytes `kind` keeps for backward at `shard` under `recompute`, from the
        measurements; None where the profile does not describe it (a recompute mode or TP
        degree not measured, sequence parallelism)."""
        if shard.sequence_parallel and shard.tp > 1:
            return None
        if kind != "transformer" and recompute != "none":
            recompute = "none"  # recomputation applies to transformer blocks only
        rows = self._rows_for(kind, shard.tp, recompute)
        if not rows:
            return None
        (value,) = self._lookup(kind, shard, recompute, rows, lambda r: (float(r.activation_bytes),))
        return value

    def covers(self, kind: str, shard: Shard, recompute: str = "none") -> bool:
        """Whether the measurements of `kind` under `recompute` span `shard` without
        extrapolating: a measured shape, or one between measured shapes."""
        rows = self._rows_for(kind, shard.tp, recompute)
        if not rows:
            return False
        lines: dict[int, list[Point]] = defaultdict(list)
        for row in rows:
            lines[row.seq].append((float(row.tokens), ()))
        try:
            _across_lengths(
                {s: sorted(p) for s, p in lines.items()}, shard.mbs * shard.seq / shard.cp, shard.seq, reach=1.0
            )
        except _OutOfRange:
            return False
        return True

    def _rows_for(self, kind: str, tp: int, recompute: str) -> list[LayerRow]:
        return self._rows.get((kind, tp, recompute), [])

    def _lookup(
        self,
        kind: str,
        shard: Shard,
        recompute: str,
        rows: list[LayerRow],
        values: Callable[[LayerRow], tuple[float, ...]],
    ) -> tuple[float, ...]:
        lines: dict[int, list[Point]] = defaultdict(list)
        for row in rows:
            lines[row.seq].append((float(row.tokens), values(row)))
        tokens = shard.mbs * shard.seq / shard.cp
        try:
            return _across_lengths({s: sorted(p) for s, p in lines.items()}, tokens, shard.seq)
        except _OutOfRange as exc:
            failed = sorted({r.tokens for r in self._failed.get((kind, shard.tp, recompute), []) if r.status == "oom"})
            note = f"; out of memory when profiled at tokens {', '.join(map(str, failed))}" if failed else ""
            cp = f" cp={shard.cp}" if shard.cp > 1 else ""
            raise PlannerError(
                f"{self.name}: {kind} at tp={shard.tp} mbs={shard.mbs} seq={shard.seq}{cp} "
                f"({tokens:g} tokens per micro-batch) is outside the measured range: "
                f"{exc.detail} (the lookup extrapolates at most {EXTRAPOLATION_FACTOR:g}x){note}; "
                "profile that shape or drop --profile"
            ) from None


class MeasuredFirst:
    """Layer times measured where the profile spans the shard, else from `fallback` (a
    `ComputeSource`, reported as `fallback_name`); activation bytes measured where the
    profile spans the shard, else None (the analytic memory model)."""

    def __init__(
        self,
        measured: ProfiledCompute,
        fallback: ComputeSource,
        fallback_name: CostSourceName,
        calibration: Calibration | None = None,
    ):
        self.measured, self.fallback, self.fallback_name = measured, fallback, fallback_name
        self.calibration = calibration
        """The fit behind the fallback when it is "calibrated"."""
        self.name = measured.name
        self.profile = measured.profile
        self._covers: dict[tuple[str, Shard, str], bool] = {}

    def source_of(self, kind: str, shard: Shard) -> CostSourceName:
        """Where the times of `kind` at `shard` come from."""
        return "measured" if self._spans(kind, shard, "none") else self.fallback_name

    def layer_times(self, kind: str, shard: Shard) -> LayerTimes:
        """Forward / backward-input / backward-weight seconds of `kind` at `shard`."""
        if self._spans(kind, shard, "none"):
            return self.measured.layer_times(kind, profiled_shard(kind, shard))
        return self.fallback.layer_times(kind, shard)

    def activation_bytes(self, kind: str, shard: Shard, recompute: str = "none") -> float | None:
        """Measured saved bytes where the profile spans the shard in that recompute mode."""
        mode = recompute if kind == "transformer" else "none"
        if not self._spans(kind, shard, mode):
            return None
        return self.measured.activation_bytes(kind, profiled_shard(kind, shard), mode)

    def ran_out_of_memory(self, kind: str, shard: Shard, recompute: str = "none") -> bool:
        """Whether the profile recorded `kind` out of memory at this shard's sequence length
        and TP degree with at most its tokens per micro-batch (one layer alone did not fit:
        no layout running it does)."""
        local = profiled_shard(kind, shard)
        tokens = local.mbs * local.seq / local.cp
        return any(
            row.status == "oom" and row.seq == local.seq and row.tokens <= tokens
            for row in self.measured._failed.get((kind, local.tp, recompute), ())
        )

    def _spans(self, kind: str, shard: Shard, recompute: str) -> bool:
        key = (kind, shard, recompute)
        if key not in self._covers:
            self._covers[key] = self.measured.covers(kind, profiled_shard(kind, shard), recompute)
        return self._covers[key]


def profiled_shard(kind: str, shard: Shard) -> Shard:
    """The shard whose profile row `kind` at `shard` is: the sequence shard (seq / cp
    tokens per sequence, no CP) for the embedding and the head, which see only their own
    tokens; the shard itself for a transformer block."""
    if kind == "transformer" or shard.cp == 1:
        return shard
    return replace(shard, seq=shard.seq // shard.cp, cp=1)


def _power_law(anchor: Point, other: Point, x: float, clamp: tuple[float, float] | None) -> tuple[float, ...]:
    """Values at x on the log-log lines through `anchor` and `other` (per component),
    slopes clamped to the range `clamp` when given; a linear blend where a value is zero."""
    (x0, v0), (x1, v1) = anchor, other
    out = []
    for a, b in zip(v0, v1):
        if a <= 0.0 or b <= 0.0:
            out.append(a + (b - a) * (x - x0) / (x1 - x0))
            continue
        slope = math.log(b / a) / math.log(x1 / x0)
        if clamp is not None:
            slope = min(clamp[1], max(clamp[0], slope))
        out.append(a * (x / x0) ** slope)
    return tuple(out)


def _interpolate(
    points: list[Point],
    x: float,
    single_slope: float,
    axis: str,
    slope_range: tuple[float, float] = (0.0, 1.0),
    reach: float = EXTRAPOLATION_FACTOR,
) -> tuple[float, ...]:
    """Values at x from points sorted by x: the measured values at a measured x, log-log
    between the bracketing points inside the range, from the nearest point outside it
    (up to `reach` times the range) with the nearest segment's slope clamped to
    `slope_range` (`single_slope` when there is one point)."""
    xs = [p[0] for p in points]
    low, high = xs[0], xs[-1]
    if x < low / reach or x > high * reach:
        raise _OutOfRange(f"measured {axis} {low:g}..{high:g}")
    if x in xs:
        return points[xs.index(x)][1]
    if len(points) == 1:
        ((x0, v0),) = points
        return tuple(v * (x / x0) ** single_slope for v in v0)
    if x < low:
        return _power_law(points[0], points[1], x, slope_range)
    if x > high:
        return _power_law(points[-1], points[-2], x, slope_range)
    i = bisect_left(xs, x)
    return _power_law(points[i - 1], points[i], x, None)


def _across_lengths(
    lines: dict[int, list[Point]], tokens: float, seq: int, reach: float = EXTRAPOLATION_FACTOR
) -> tuple[float, ...]:
    """The lines evaluated at the same sequences per micro-batch (tokens / seq), then
    interpolated over sequence length; up to `reach` times beyond the measured range."""
    lengths = sorted(lines)
    per_sequence = tokens / seq
    if seq in lines:
        return _interpolate(lines[seq], tokens, 1.0, f"tokens at seq {seq}", reach=reach)
    if seq < lengths[0] / reach or seq > lengths[-1] * reach:
        raise _OutOfRange(f"measured seq {lengths[0]}..{lengths[-1]}")
    if len(lengths) == 1:
        return _interpolate(lines[lengths[0]], tokens, 1.0, f"tokens at seq {lengths[0]}", reach=reach)
    i = min(max(bisect_left(lengths, seq), 1), len(lengths) - 1)
    at_length = [
        (float(s), _interpolate(lines[s], per_sequence * s, 1.0, f"tokens at seq {s}", reach=reach))
        for s in lengths[i - 1 : i + 1]
    ]
    return _interpolate(at_length, float(seq), 1.0, "seq", slope_range=(1.0, 2.0), reach=reach)


def check_model(profile: Profile, spec: ModelSpec, label: str) -> None:
    """PlannerError unless the profile was measured for `spec`'s shape (names may differ)."""
    measured = profile.model.model_dump(exclude=_SHAPE_EXEMPT)
    wanted = spec.model_dump(exclude=_SHAPE_EXEMPT)
    diffs = [f"{k} {measured[k]} != {wanted[k]}" for k in wanted if measured[k] != wanted[k]]
    if diffs:
        raise PlannerError(
            f"{label} was measured for model '{profile.model.name}', not for '{spec.name}': "
            f"{'; '.join(diffs[:4])}{' ...' if len(diffs) > 4 else ''}; "
            f"profile it with `planner profile --model {spec.name}`"
        )


def check_device(profile: Profile, gpu: GpuSpec, label: str) -> None:
    """PlannerError when a GPU profile was measured on another accelerator than `gpu`
    (CPU profiles, dry runs, are accepted with any GPU)."""
    if profile.device_type == "cpu":
        log.warning("%s was measured on a CPU; its times are a dry run, not %s times", label, gpu.name)
        return
    model_token = gpu.name.split("-")[0].upper()
    if model_token not in profile.device.upper().replace("-", " ").split():
        raise PlannerError(
            f"{label} was measured on '{profile.device}', not on {gpu.name}; "
            f"pass the matching --gpu or profile on {gpu.name}"
        )


def profiled_source(path: Path, spec: ModelSpec, gpu: GpuSpec) -> ProfiledCompute:
    """The compute source of the profile in `path`, checked against the model and GPU."""
    path = Path(path)
    profile = store.load(path)
    label = f"profile {path.name}"
    check_model(profile, spec, label)
    check_device(profile, gpu, label)
    if not any(r.status == "ok" for r in profile.rows):
        raise ConfigError(f"{label} has no successful layer measurements")
    return ProfiledCompute(profile, f"profile:{path.name}")
