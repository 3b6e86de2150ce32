"""Event simulation of a pipeline order on `StageCosts`: step time, bubble, busy, in-flight.

Model. Each rank executes its compute actions in list order, one at a time, each as early
as its inputs allow: F(s, m) after F(s-1, m) ends, B/I(s, m) after B/I(s+1, m) ends, plus
`p2p_s` when the two stages are on different ranks (the transfer overlaps compute and links
have no contention); the last stage's backward follows its own forward and W(s, m) its I on
the same rank, which the rank order already implies. A full backward B costs I + W. All
ranks start at t = 0; a per-rank `slowdown` scales that rank's compute times.

Activation memory. A micro-batch's activations on a chunk are held from its F start. A
full backward B frees them when it ends. For a split backward we follow Qi et al. 2024
(section 2.1, Table 1): I needs the whole set M_B (`activation_bytes`), W only the layer
inputs and output gradients M_W < M_B (`weight_grad_bytes`), so M_B - M_W is freed when I
ends and M_W when W ends. Counted in micro-batches, `peak_inflight` holds a micro-batch until
its W ends (the paper's "in-flight micro-batches": ZB-H1 keeps P on every rank, 1F1B has
P - r) and `peak_inflight_freed_at_input_grad` until its I ends (ZB-H1 then equals 1F1B's
P - r). In bytes ZB-H1's rank r peaks at (P-r) M_B + r M_W: at most 1F1B's P M_B, reached on
rank 0, which is the paper's "same memory as 1F1B".

Blocking send/recv. Runtimes that wait for each send and receive before computing again
(Megatron-LM's batch_isend_irecv followed by torch.cuda.synchronize(), DeepSpeed's
PipelineEngine with blocking dist.send / dist.recv) hold a rank's stream after every compute
action whose output goes to another rank: `StageCosts.send_hold_forward_s` /
`send_hold_backward_s` are added to those actions' durations (the transfer is inside them) and
reported per rank as `blocked_s`.

Paired exchange calls. Where the runtime's own blocking calls are known (an
`ExchangeProgram` passed to `compile_order` / `compile_schedule`, e.g. Megatron-LM's in
planner/runtimes/megatron_exchange.py) the order is compiled with them (exchanges.py): each
call ends at the latest post among itself and the calls it pairs with, plus one hold, the
transfer. This charges a sender's wait for a late receiver, which holds alone miss on uneven
stages and in warm-up / cool-down. `blocked_s` then counts one hold per call after the rank's
first action; a call's wait for its peers is idle time like any bubble. Without a program the
holds follow each sender. A send is assumed to wait for its receiver whatever its size (NCCL
may buffer a small message in the peer's FIFO and finish early).

Fidelity limits: no link contention or NCCL launch overheads, no compute/communication
interference, no optimizer step or gradient reduction at the end of the step; DualPipeV's
overlapped F/B pairs run back to back.

Speed. `compile_order` validates once and resolves every dependency to an index in one
topological order (a dependency-driven sweep that also detects deadlocks), so `simulate`
is one pass over flat lists; `compile_schedule` caches the compiled form per (name, P, M, V)
for search loops that re-cost the same shape. Paired calls are compiled the same way: actions
and calls in one topological order, each call with the nodes whose ends are its peers' posts.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from types import MappingProxyType
from typing import NamedTuple

from planner.errors import ScheduleError
from planner.schedule.actions import Action, B, F, I, PipelineOrder, W
from planner.schedule.costs import StageCosts
from planner.schedule.exchanges import ExchangeProgram, Exchanges, place_exchanges
from planner.schedule.registry import generate
from planner.schedule.registry import pipeline_starts as schedule_pipeline_starts
from planner.schedule.validate import OrderInfo, index_order

_KIND_CODE = {F: 0, I: 1, W: 2, B: 3}


class TimelineEntry(NamedTuple):
    """One executed action: its rank and [start_s, end_s)."""

    rank: int
    action: Action
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledSchedule:
    """A validated order with dependencies resolved, in a topological execution order.

    Positions p index the flat arrays; dep[p] < p is the cross-stage input of action p
    (-1: none) and remote[p] says whether it crosses ranks (then p2p_s applies). The arrays
    are compact (4 bytes an entry, for caches of big shapes) and read-only by contract.
    """

    info: OrderInfo
    rank_actions: tuple[tuple[Action, ...], ...]
    """Each rank's actions in its execution order (a frozen copy of the order)."""
    rank: array
    dep: array
    remote: array
    slot: array
    """(rank * V + chunk) * 4 + kind code (F 0, I 1, W 2, B 3): the cost-table entry."""
    slot_counts: tuple[int, ...]
    """How many actions use each slot (busy time = sum of count x duration)."""
    rank_positions: tuple[array, ...]
    """Per rank, the positions of its actions in its list order (= time order)."""
    peak_inflight: tuple[int, ...]
    peak_inflight_freed_at_input_grad: tuple[int, ...]
    unit: array
    """Micro-batch index of each position (for `StageCosts.unit_scale`)."""
    sends: array
    """Per position, 1 where the action's output goes to another rank (F to the next stage,
    B or I to the previous one), for blocking send/recv holds."""
    exchanges: Exchanges | None = None
    """The runtime's blocking exchange calls interleaved with the actions, where it was
    compiled with the runtime's `ExchangeProgram`; None: blocking holds follow each sender."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Figures of one simulated step. Times in seconds; per-rank tuples are indexed by rank."""

    step_time_s: float
    """Synchronous step makespan: end of the last action (all ranks start at 0)."""
    span_s: float
    """The zero-bubble paper's `cost`: the longest per-rank span from the rank's first
    action's start to its last action's end."""
    bubble_fraction: float
    """(P * span_s - sum(busy_s)) / (P * span_s): idle share within the ranks' spans (Qi et al.
    2024, section 2); equals (P-1)/(M+P-1) for 1F1B with uniform costs."""
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    """step_time_s - busy_s per rank."""
    finish_s: tuple[float, ...]
    """End of each rank's last action."""
    bubble_per_rank: tuple[float, ...]
    """(span_s - busy_s[r]) / span_s; their mean is bubble_fraction."""
    peak_inflight: tuple[int, ...]
    """Most micro-batch x chunk activations a rank holds at once, each held from its F start
    until its backward completes: the end of B, or of W for a split backward (the paper's
    count of in-flight micro-batches: ZB-H1 keeps it at P on every rank)."""
    peak_inflight_freed_at_input_grad: tuple[int, ...]
    """Same, but a split backward frees at the end of I (ZB-H1 then equals 1F1B's P - r)."""
    peak_activation_bytes: tuple[float, ...] | None
    """Peak bytes per rank: activation_bytes held from F start to I (or B) end, then
    weight_grad_bytes until W end; None when the costs carry no sizes."""
    timeline: tuple[TimelineEntry, ...] | None
    blocked_s: tuple[float, ...] = ()
    """Per rank, seconds its stream is held by blocking send/recv (part of its idle time,
    not of busy_s); empty when the costs have no holds."""


def _inflight_peaks(codes: list[int], offset: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Peak held activations per rank, freed at W (or B) and freed at I (or B).

    `codes` are the kind codes (F 0, I 1, W 2, B 3) of all ranks' actions, rank r's at
    offset[r]:offset[r+1]. A rank's actions run one after another, so its list order is its
    time order and the peaks follow from a running count over the list.
    """
    until_w, until_i = [], []
    for r in range(len(offset) - 1):
        held = held_i = peak = peak_i = 0
        for code in codes[offset[r] : offset[r + 1]]:
            if code == 0:
                held += 1
                held_i += 1
                if held > peak:
                    peak = held
                if held_i > peak_i:
                    peak_i = held_i
            elif code == 1:
                held_i -= 1
            elif code == 2:
                held -= 1
            else:
                held -= 1
                held_i -= 1
        until_w.append(peak)
        until_i.append(peak_i)
    return tuple(until_w), tuple(until_i)


def _deadlock_message(
    order: PipelineOrder, flat: list[Action], offset: list[int], ptr: list[int], dep: list[int], rank_of: list[int]
) -> str:
    stuck = []
    for r in sorted(order):
        if ptr[r] < len(order[r]):
            g = offset[r] + ptr[r]
            d = dep[g]
            stuck.append(f"rank {r} waits at {flat[g]} for {flat[d]} (rank {rank_of[d]})")
    return (
        "schedule deadlocks: "
        + "; ".join(stuck)
        + ". Reorder so that every rank's next action has its input produced first."
    )


def _dependencies(
    flat: list[Action], tables: list[list[int]], info: OrderInfo, pipeline_starts: frozenset[int]
) -> list[int]:
    """Index in `flat` of each action's cross-stage input: F(s-1, m) for F(s, m), the
    backward (B or I) of (s+1, m) for a backward of (s, m); -1 for none (first-stage F,
    last-stage backward, W: their inputs are earlier on the same rank). A stage in
    `pipeline_starts` begins a separate pipeline: its F has no input and the stage before
    it is a last stage (Chimera's two directions)."""
    num_mb, last = info.num_microbatches, info.num_stages - 1
    fwd, inp, _, full = tables
    dep = [-1] * len(flat)
    for g, (stage, kind, mb) in enumerate(flat):
        if kind == F:
            if stage > 0 and stage not in pipeline_starts:
                dep[g] = fwd[(stage - 1) * num_mb + mb]
        elif kind != W and stage < last and stage + 1 not in pipeline_starts:
            key = (stage + 1) * num_mb + mb
            dep[g] = full[key] if full[key] >= 0 else inp[key]
    return dep


def compile_order(
    order: PipelineOrder | Mapping[int, Sequence[Action]],
    pipeline_starts: frozenset[int] = frozenset(),
    exchanges: ExchangeProgram | None = None,
) -> CompiledSchedule:
    """Validate `order` (validate.check_order), resolve dependencies, find a topological
    execution order; ScheduleError if invalid or deadlocked (naming each stuck rank).
    `pipeline_starts`: stages other than 0 that start a pipeline of their own (see
    `_dependencies`; registry.pipeline_starts gives a schedule's). `exchanges`: the blocking
    exchange calls the runtime runs this order with (None: holds after each sending action,
    see the module docstring)."""
    info, tables = index_order(order)
    num_ranks, vpp = info.num_ranks, info.vpp
    offset = [0] * (num_ranks + 1)
    for r in range(num_ranks):
        offset[r + 1] = offset[r] + len(order[r])
    flat = [a for r in range(num_ranks) for a in order[r]]
    rank_of = [r for r in range(num_ranks) for _ in order[r]]
    codes = [_KIND_CODE[kind] for _, kind, _ in flat]
    dep = _dependencies(flat, tables, info, pipeline_starts)

    # Dependency-driven sweep: run each rank until its next action waits on another rank's
    # unfinished one, park it on that action, wake it when the action completes.
    n = len(flat)
    done = bytearray(n)
    waiter = [-1] * n
    ptr = [0] * num_ranks
    topo: list[int] = []
    ready = list(range(num_ranks - 1, -1, -1))
    while ready:
        r = ready.pop()
        g, stop = offset[r] + ptr[r], offset[r + 1]
        while g < stop:
            d = dep[g]
            if d >= 0 and not done[d]:
                waiter[d] = r
                break
            done[g] = 1
            topo.append(g)
            if waiter[g] >= 0:
                ready.append(waiter[g])
            g += 1
        ptr[r] = g - offset[r]
    if len(topo) < n:
        raise ScheduleError(_deadlock_message(order, flat, offset, ptr, dep, rank_of))

    position = [0] * n
    for p, g in enumerate(topo):
        position[g] = p
    stage_chunk = info.stage_chunk
    slot_of = [(r * vpp + stage_chunk[stage]) * 4 + code for r, (stage, _, _), code in zip(rank_of, flat, codes)]
    slot_counts = [0] * (num_ranks * vpp * 4)
    for k in slot_of:
        slot_counts[k] += 1
    until_w, until_i = _inflight_peaks(codes, offset)
    # an action's input from another rank: it crosses a link (p2p_s) and its producer sends
    remote, sends = bytearray(n), bytearray(n)
    for g, d in enumerate(dep):
        if d >= 0 and rank_of[d] != rank_of[g]:
            remote[g] = sends[d] = 1
    return CompiledSchedule(
        info=info,
        rank_actions=tuple(tuple(order[r]) for r in range(num_ranks)),
        rank=array("i", [rank_of[g] for g in topo]),
        dep=array("i", [position[dep[g]] if dep[g] >= 0 else -1 for g in topo]),
        remote=array("b", [remote[g] for g in topo]),
        slot=array("i", [slot_of[g] for g in topo]),
        slot_counts=tuple(slot_counts),
        rank_positions=tuple(array("i", position[offset[r] : offset[r + 1]]) for r in range(num_ranks)),
        peak_inflight=until_w,
        peak_inflight_freed_at_input_grad=until_i,
        unit=array("i", [flat[g][2] for g in topo]),
        sends=array("b", [sends[g] for g in topo]),
        exchanges=(
            place_exchanges(exchanges, order, info, offset, [code == 0 for code in codes], dep, remote, position)
            if exchanges is not None and num_ranks > 1
            else None
        ),
    )


@lru_cache(maxsize=128)
def generated_order(
    name: str, pp: int, num_microbatches: int, vpp: int = 1, segments: int = 1
) -> Mapping[int, tuple[Action, ...]]:
    """`generate`'s order of schedule `name` for (P, M, V, segments), read-only and cached:
    the search derives both a shape's held counts and its compiled form from it."""
    order = generate(name, pp, num_microbatches, vpp, segments)
    return MappingProxyType({rank: tuple(actions) for rank, actions in order.items()})


@lru_cache(maxsize=128)
def compile_schedule(
    name: str, pp: int, num_microbatches: int, vpp: int = 1, segments: int = 1, exchanges: ExchangeProgram | None = None
) -> CompiledSchedule:
    """Generate schedule `name` for (P, M, V, segments) and compile it (with the runtime's
    blocking `exchanges`, if any: `compile_order`); cached (search loops re-cost it, a 405B
    search over a hundred shapes)."""
    order = generated_order(name, pp, num_microbatches, vpp, segments)
    return compile_order(order, schedule_pipeline_starts(name, pp, vpp), exchanges)


def _slot_durations(costs: StageCosts) -> list[float]:
    out: list[float] = []
    for r in range(costs.num_ranks):
        factor = costs.slowdown[r] if costs.slowdown is not None else 1.0
        for c in range(costs.vpp):
            f = costs.forward_s[r][c] * factor
            i = costs.backward_input_s[r][c] * factor
            w = costs.backward_weight_s[r][c] * factor
            out += [f, i, w, i + w]
    return out


def _scaled_durations(compiled: CompiledSchedule, slot_dur: list[float], scale: tuple[float, ...]) -> list[float]:
    """Each position's duration with its micro-batch's factor on F and I (B: on its I part)."""
    if len(scale) < compiled.info.num_microbatches:
        raise ScheduleError(
            f"StageCosts.unit_scale has {len(scale)} factors but the schedule has "
            f"{compiled.info.num_microbatches} micro-batch indices; give one per index"
        )
    durs = []
    for k, u in zip(compiled.slot, compiled.unit):
        code, x = k & 3, scale[u]
        if code == 3:  # B = I + W: W is slot k-1, I slot k-2
            durs.append(slot_dur[k - 2] * x + slot_dur[k - 1])
        elif code == 2:
            durs.append(slot_dur[k])
        else:
            durs.append(slot_dur[k] * x)
    return durs


def _peak_bytes(compiled: CompiledSchedule, costs: StageCosts) -> tuple[float, ...] | None:
    if costs.activation_bytes is None:
        return None
    held_after_i = costs.weight_grad_bytes or costs.activation_bytes
    retained = costs.retained_bytes or tuple((0.0,) * len(row) for row in costs.activation_bytes)
    info = compiled.info
    peaks = []
    for r in range(info.num_ranks):
        full, kept, stays = costs.activation_bytes[r], held_after_i[r], retained[r]
        held = peak = 0.0
        for stage, kind, _ in compiled.rank_actions[r]:
            c = info.stage_chunk[stage]
            if kind == F:
                held += full[c]
                peak = max(peak, held)
            elif kind == I:
                held -= full[c] - kept[c]
            elif kind == W:
                held -= kept[c] - stays[c]
            else:
                held -= full[c] - stays[c]
        peaks.append(peak)
    return tuple(peaks)


def peak_held_counts(
    order: PipelineOrder | Mapping[int, Sequence[Action]], vpp: int
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per rank, the per-chunk counts of micro-batches held (F started, backward not ended)
    at the moments its activations can peak, without the dominated ones: the rank's peak
    bytes are the largest dot product of one of these with its per-chunk activation bytes.
    Depends on the action order only, not on the costs (chunk c = c-th smallest stage)."""
    result = []
    for rank in sorted(order):
        actions = order[rank]
        chunk_of = {s: c for c, s in enumerate(sorted({a.stage_index for a in actions}))}
        held = [0] * vpp
        tops: set[tuple[int, ...]] = set()
        rising = False  # within a run of F's only the last count can be a peak
        for stage, kind, _ in actions:
            if kind == F:
                held[chunk_of[stage]] += 1
                rising = True
            elif kind in (W, B):
                if rising:
                    tops.add(tuple(held))
                    rising = False
                held[chunk_of[stage]] -= 1
        if rising:
            tops.add(tuple(held))
        kept: list[tuple[int, ...]] = []
        for v in sorted(tops, key=sum, reverse=True):
            if not any(all(a >= b for a, b in zip(u, v)) for u in kept):
                kept.append(v)
        result.append(tuple(sorted(kept)))
    return tuple(result)


def simulate(schedule: PipelineOrder | CompiledSchedule, costs: StageCosts, *, timeline: bool = False) -> SimResult:
    """Simulate one step of `schedule` (an order or a compiled one) on `costs`.

    Returns the makespan, the paper's bubble fraction, per-rank busy/idle, in-flight and
    activation-byte peaks, and with `timeline=True` every action's start and end.
    ScheduleError if the order is invalid or deadlocks, or the costs' (P, V) differ.
    """
    compiled = schedule if isinstance(schedule, CompiledSchedule) else compile_order(schedule)
    info = compiled.info
    if (costs.num_ranks, costs.vpp) != (info.num_ranks, info.vpp):
        raise ScheduleError(
            f"costs are for {costs.num_ranks} ranks x {costs.vpp} chunks but the schedule has "
            f"{info.num_ranks} ranks x {info.vpp} chunks; build StageCosts with the schedule's shape"
        )
    slot_dur = _slot_durations(costs)
    durs = [slot_dur[k] for k in compiled.slot]
    if costs.unit_scale is not None:
        durs = _scaled_durations(compiled, slot_dur, costs.unit_scale)
    blocked = [0.0] * info.num_ranks
    compute = durs
    holds = costs.send_hold_forward_s or costs.send_hold_backward_s
    if holds and compiled.exchanges is not None:
        end, durs, blocked = _rendezvous(compiled.exchanges, durs, costs, info.num_ranks)
    else:
        if holds:
            durs = _with_send_holds(compiled, durs, costs, blocked)
        end = _run(compiled, durs, costs.p2p_s, info.num_ranks)

    num_ranks = info.num_ranks
    busy = [0.0] * num_ranks
    if costs.unit_scale is None:
        for k, count in enumerate(compiled.slot_counts):
            busy[k // (4 * info.vpp)] += count * slot_dur[k]
    else:
        for r, d in zip(compiled.rank, compute):
            busy[r] += d
    spans = [end[pos[-1]] - (end[pos[0]] - durs[pos[0]]) for pos in compiled.rank_positions]
    span = max(spans)
    step = max(end) if end else 0.0
    # max(0, .): busy is summed per cost slot, the span along the timeline; float noise only
    per_rank = tuple(max(0.0, (span - b) / span) if span > 0 else 0.0 for b in busy)
    entries = None
    if timeline:
        entries = tuple(
            TimelineEntry(r, action, end[p] - durs[p], end[p])
            for r, positions in enumerate(compiled.rank_positions)
            for action, p in zip(compiled.rank_actions[r], positions)
        )
    return SimResult(
        step_time_s=step,
        span_s=span,
        bubble_fraction=sum(per_rank) / num_ranks,
        busy_s=tuple(busy),
        idle_s=tuple(max(0.0, step - b) for b in busy),
        finish_s=tuple(end[pos[-1]] for pos in compiled.rank_positions),
        bubble_per_rank=per_rank,
        peak_inflight=compiled.peak_inflight,
        peak_inflight_freed_at_input_grad=compiled.peak_inflight_freed_at_input_grad,
        peak_activation_bytes=_peak_bytes(compiled, costs),
        timeline=entries,
        blocked_s=tuple(blocked) if any(blocked) else (),
    )


def _run(compiled: CompiledSchedule, durs: list[float], p2p: float, num_ranks: int) -> list[float]:
    """Each position's end: its rank's previous action's end or its input's arrival, plus its duration."""
    lags = [p2p * x for x in compiled.remote] if p2p else repeat(0.0)
    end: list[float] = []
    append = end.append
    free = [0.0] * num_ranks
    for r, d, lag, dur in zip(compiled.rank, compiled.dep, lags, durs):
        s = free[r]
        if d >= 0:
            t = end[d] + lag
            if t > s:
                s = t
        e = s + dur
        append(e)
        free[r] = e
    return end


def _rendezvous(
    program: Exchanges, durs: list[float], costs: StageCosts, num_ranks: int
) -> tuple[list[float], list[float], list[float]]:
    """Run actions and blocking exchange calls: a call ends at the latest post among itself and
    its peer calls plus the hold of its directions. Returns each position's end (with its
    trailing calls), its duration from its start to that end, and each rank's transfer seconds
    in calls after its first action (a call's wait for its peers is bubble, not transfer)."""
    hold_f, hold_b = costs.send_hold_forward_s, costs.send_hold_backward_s
    hold = (0.0, hold_f, hold_b, max(hold_f, hold_b))
    node_end: list[float] = []
    append = node_end.append
    start = [0.0] * len(durs)
    free = [0.0] * num_ranks
    blocked = [0.0] * num_ranks
    for r, a, waits, way, counted in zip(
        program.rank, program.action, program.waits, program.direction, program.after_start
    ):
        s = free[r]
        if a >= 0:
            start[a] = s
            e = s + durs[a]
        else:
            for q in waits:
                t = node_end[q]
                if t > s:
                    s = t
            e = s + hold[way]
            if counted:
                blocked[r] += hold[way]
        append(e)
        free[r] = e
    end = [node_end[k] for k in program.last_node]
    return end, [e - s for e, s in zip(end, start)], blocked


def _with_send_holds(
    compiled: CompiledSchedule, durs: list[float], costs: StageCosts, blocked: list[float]
) -> list[float]:
    """Durations with each sending action's blocking hold added; `blocked` gets each rank's total."""
    hold = (costs.send_hold_forward_s, costs.send_hold_backward_s, 0.0, costs.send_hold_backward_s)
    out = []
    for r, k, sends, d in zip(compiled.rank, compiled.slot, compiled.sends, durs):
        if sends:
            h = hold[k & 3]
            blocked[r] += h
            d += h
        out.append(d)
    return out
