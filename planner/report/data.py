"""The figures of one plan's report, as plain values: its simulated timeline with the real
per-rank, per-chunk costs, the transfers and idle gaps between actions, the data-parallel and
optimizer tail of the step, each rank's saved activations over the step, and the training
budget for a token count. Pure functions of the cost model and the layout."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model import CostModel
from planner.layout import Layout
from planner.pipeline import ChunkCosts, pipeline_timing
from planner.predict import Prediction, chunk_costs, exposed_dp_times, predict
from planner.schedule import compile_schedule
from planner.schedule.actions import B, F, I, W

SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One interval on one pipeline rank's row of the timeline."""

    rank: int
    kind: str
    """F, I, W, B (compute), recv (a pipeline transfer arriving), idle, dp (exposed data-parallel
    communication) or step (the synchronised tail: loss-scale check, gradient norm, optimizer)."""
    start_s: float
    end_s: float
    label: str
    """What the hover shows: stage, chunk, layers, micro-batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFigures:
    """Everything the report draws for one plan."""

    prediction: Prediction
    bars: tuple[Bar, ...]
    activation_curves: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]
    """Per rank, (times, saved activation bytes from that time on): a step function."""
    memory_limit_bytes: float


def plan_figures(model: CostModel, layout: Layout, global_batch: int, seq: int) -> PlanFigures:
    """Re-simulate `layout` with its own costs and collect the timeline, transfers, idle
    gaps, the step's tail and the activation memory over time."""
    prediction = predict(model, layout, global_batch, seq)
    costs = chunk_costs(model, layout, seq)
    timing = pipeline_timing(costs, layout.schedule, layout.pp, layout.vpp, layout.num_microbatches, timeline=True)
    stage_chunk = compile_schedule(layout.schedule, layout.pp, layout.num_microbatches, layout.vpp).info.stage_chunk
    compute = [_compute_bar(entry, stage_chunk[entry.action.stage_index], layout, costs) for entry in timing.timeline]
    bars = compute + _transfers(timing.timeline, costs.p2p_s) + _idle(compute, layout.pp)
    bars += _tail(model, layout, costs, timing.finish_s, prediction)
    curves = tuple(_activation_curve(timing.timeline, stage_chunk, costs, r) for r in range(layout.pp))
    return PlanFigures(
        prediction=prediction,
        bars=tuple(bars),
        activation_curves=curves,
        memory_limit_bytes=model.cluster.memory_limit_bytes,
    )


def _compute_bar(entry, chunk: int, layout: Layout, costs: ChunkCosts) -> Bar:
    stage, kind, micro = entry.action
    start, end = layout.stage_layers[entry.rank][chunk]
    label = (
        f"{kind.value} micro-batch {micro}, stage {stage} (chunk {chunk}, layers {start}-{end - 1}, "
        f"recompute {layout.recompute[entry.rank]})"
    )
    return Bar(rank=entry.rank, kind=kind.value, start_s=entry.start_s, end_s=entry.end_s, label=label)


def _transfers(timeline, p2p_s: float) -> list[Bar]:
    """A recv bar on the receiving rank for every cross-rank dependency: from when the
    sender's action ends for `p2p_s` (the simulator's lag on that dependency)."""
    if p2p_s <= 0:
        return []
    done = {
        (e.action.stage_index, "F" if e.action.computation_type == F else "B", e.action.microbatch_index): e
        for e in timeline
        if e.action.computation_type in (F, I, B)
    }
    last_stage = max(e.action.stage_index for e in timeline)
    bars = []
    for e in timeline:
        stage, kind, micro = e.action
        if kind == F and stage > 0:
            source = done[(stage - 1, "F", micro)]
            what = "activation"
        elif kind in (I, B) and stage < last_stage:
            source = done[(stage + 1, "B", micro)]
            what = "gradient"
        else:
            continue
        if source.rank != e.rank:
            bars.append(
                Bar(
                    rank=e.rank,
                    kind="recv",
                    start_s=source.end_s,
                    end_s=source.end_s + p2p_s,
                    label=f"recv {what} of micro-batch {micro} from rank {source.rank}",
                )
            )
    return bars


def _idle(compute: list[Bar], pp: int) -> list[Bar]:
    """The gaps on each rank's compute stream between t = 0 and its last action."""
    bars = []
    for rank in range(pp):
        clock = 0.0
        for bar in sorted((b for b in compute if b.rank == rank), key=lambda b: b.start_s):
            if bar.start_s > clock + 1e-12:
                bars.append(Bar(rank=rank, kind="idle", start_s=clock, end_s=bar.start_s, label="idle"))
            clock = max(clock, bar.end_s)
    return bars


def _tail(model: CostModel, layout: Layout, costs: ChunkCosts, finish_s, prediction: Prediction) -> list[Bar]:
    """Each rank's exposed data-parallel communication after its last action, then the
    synchronised tail every rank runs until the step ends."""
    exposed = exposed_dp_times(model, layout, costs)
    bars = [
        Bar(
            rank=r,
            kind="dp",
            start_s=finish_s[r],
            end_s=finish_s[r] + exposed[r],
            label="exposed data-parallel gradient reduction / parameter gather",
        )
        for r in range(layout.pp)
        if exposed[r] > 0
    ]
    breakdown = prediction.time_breakdown_s
    tail = sum(breakdown.get(k, 0.0) for k in ("loss_scale_check", "grad_norm", "optimizer"))
    if tail > 0:
        begin = prediction.step_time_s - tail
        bars += [
            Bar(
                rank=r,
                kind="step",
                start_s=begin,
                end_s=prediction.step_time_s,
                label="loss-scale check, gradient norm and optimizer step",
            )
            for r in range(layout.pp)
        ]
    return bars


Curve = tuple[tuple[float, ...], tuple[float, ...]]


def _activation_curve(timeline, stage_chunk, costs: ChunkCosts, rank: int) -> Curve:
    """Saved activation bytes on `rank` over the step, as the simulator counts them: a
    micro-batch's bytes are held from its F start until its B ends, or its W ends when the
    backward is split (the pipeline timing keeps them all until W). A rank's actions run in
    its list order, so the events are taken in that order (not re-sorted by float times)."""
    events = []
    held_bytes = costs.activation_bytes[rank]
    for e in timeline:
        if e.rank != rank:
            continue
        size = held_bytes[stage_chunk[e.action.stage_index]]
        kind = e.action.computation_type
        if kind == F:
            events.append((e.start_s, size))
        elif kind in (W, B):
            events.append((e.end_s, -size))
    times, values, held = [0.0], [0.0], 0.0
    for time, delta in events:
        held += delta
        times.append(time)
        values.append(max(0.0, held))
    return tuple(times), tuple(values)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingBudget:
    """What training on `tokens` tokens costs with a plan."""

    tokens: float
    steps: float
    days: float
    gpu_hours: float
    cost: float | None
    """gpu_hours x price per GPU-hour; None without a price."""


def training_budget(
    tokens: float, global_batch: int, seq: int, step_time_s: float, num_gpus: int, gpu_hour_price: float | None = None
) -> TrainingBudget:
    """Days, GPU-hours and cost of training `tokens` tokens at one step per `step_time_s`."""
    steps = tokens / (global_batch * seq)
    seconds = steps * step_time_s
    gpu_hours = seconds / 3600.0 * num_gpus
    return TrainingBudget(
        tokens=tokens,
        steps=steps,
        days=seconds / SECONDS_PER_DAY,
        gpu_hours=gpu_hours,
        cost=None if gpu_hour_price is None else gpu_hours * gpu_hour_price,
    )
