"""Automatic zero-bubble scheduling (Qi et al. 2024, section 3): a greedy heuristic.

Given per-stage F, I, W times, the p2p time and a per-rank memory limit in micro-batches
(activations held from F start until W end, the paper's in-flight count), build each rank's
F/I/W order for one chunk per rank (V = 1) that keeps the makespan low:

1. Warm-up: run as many F as the limit allows while they end before the first I can start;
   a hyperparameter allows one more F that delays that I (the paper's first binary knob).
2. Steady state: alternate F and I; fill a wait of at least W with a pending W; with the
   second knob also fill shorter waits when the wait would make this rank's cumulative idle
   the largest of all ranks; run a W first when the memory limit blocks the next F.
3. Cool-down: the remaining I's, W's filling the waits, then the remaining W's.

The knobs (plus whether a tie goes to I or F) are searched exhaustively and the order with
the smallest simulated makespan wins, as the paper grid-searches its hyperparameters; the
hand-crafted ZB-H1 and ZB-H2 orders compete too where they fit the memory limit (the greedy
alone falls up to 7% behind ZB-H1 at P >= 24 with p2p latency). A hill-climb (`improve`)
then moves single actions a few places while that lowers the makespan. Every rank runs F's, I's and W's in micro-batch order (FIFO), the space
`zb_ilp.optimal_schedule` optimises over exactly, so the result is never below the ILP's
optimum; tests/schedule/test_auto_zb.py checks it stays within 5% of it on small cases.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from planner.errors import ScheduleError
from planner.schedule.actions import Action, F, I, PipelineOrder, W
from planner.schedule.costs import StageCosts
from planner.schedule.generators import zb_h1, zb_h2
from planner.schedule.simulate import compile_order, simulate

_INF = float("inf")
_F, _I, _W = 0, 1, 2
_TYPE = (F, I, W)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeuristicKnobs:
    """The heuristic's binary hyperparameters."""

    extra_warmup_forward: bool
    """Run one more warm-up F even when it delays the first I."""
    fill_short_gaps: bool
    """Put a W into a wait shorter than W when the wait would raise the largest cumulative idle."""
    input_grad_first: bool
    """When F and I could both start now, run I (otherwise F and I alternate)."""


def stage_times(costs: StageCosts) -> list[tuple[float, float, float]]:
    """(F, I, W) seconds per rank of a one-chunk cost table, straggler slowdown applied."""
    if costs.vpp != 1:
        raise ScheduleError(
            f"automatic zero-bubble scheduling places one chunk per rank; got costs with vpp={costs.vpp}"
        )
    out = []
    for r in range(costs.num_ranks):
        factor = costs.slowdown[r] if costs.slowdown is not None else 1.0
        out.append(
            (
                costs.forward_s[r][0] * factor,
                costs.backward_input_s[r][0] * factor,
                costs.backward_weight_s[r][0] * factor,
            )
        )
    return out


def check_problem(costs: StageCosts, num_microbatches: int, memory_limit: int) -> None:
    """ScheduleError unless (costs, M, memory limit) define a schedulable problem."""
    stage_times(costs)
    if num_microbatches < 1:
        raise ScheduleError(f"need at least one micro-batch, got {num_microbatches}")
    if memory_limit < 1:
        raise ScheduleError(
            f"memory_limit counts micro-batches of activations a rank may hold; it must be >= 1, got {memory_limit}"
        )


class _Greedy:
    """One run of the heuristic with fixed knobs; times are ASAP, as the simulator's."""

    def __init__(self, costs: StageCosts, num_microbatches: int, memory_limit: int, knobs: HeuristicKnobs):
        self.times = stage_times(costs)
        self.p2p = costs.p2p_s
        self.pp, self.m, self.limit, self.knobs = costs.num_ranks, num_microbatches, memory_limit, knobs
        pp, m = self.pp, self.m
        self.next_f, self.next_i, self.w_done = [0] * pp, [0] * pp, [0] * pp
        self.free, self.idle = [0.0] * pp, [0.0] * pp
        self.last_fi = [_I] * pp
        self.pending: list[deque[int]] = [deque() for _ in range(pp)]
        self.f_end = [[_INF] * m for _ in range(pp)]
        self.i_end = [[_INF] * m for _ in range(pp)]
        self.actions: list[list[Action]] = [[] for _ in range(pp)]
        # shortest time from the end of F(s, j) to I(s, j) being ready: the rest of the
        # micro-batch's forward and backward through the later ranks, with its transfers
        self.round_trip = [
            sum(f + i for f, i, _ in self.times[s + 1 :]) + 2 * self.p2p * (pp - 1 - s) for s in range(pp)
        ]

    def _ready(self, s: int) -> tuple[float, float]:
        """Earliest start of the next F and the next I of rank s as known now (inf: unknown)."""
        nf, ni = self.next_f[s], self.next_i[s]
        f_ready = i_ready = _INF
        if nf < self.m and nf - self.w_done[s] < self.limit:
            f_ready = 0.0 if s == 0 else self.f_end[s - 1][nf] + self.p2p
        if ni < nf:
            i_ready = self.f_end[s][ni] if s == self.pp - 1 else self.i_end[s + 1][ni] + self.p2p
        t = self.free[s]
        return max(t, f_ready), max(t, i_ready)

    def candidate(self, s: int, max_idle: float) -> tuple[float, int]:
        """(start, kind) of rank s's next action, or (inf, -1) while it must wait for news."""
        t, (fs, is_) = self.free[s], self._ready(s)
        f_time, _, w_time = self.times[s]
        has_w = bool(self.pending[s])
        if self.next_i[s] >= self.m:
            return (t, _W) if has_w else (_INF, -1)
        if self.next_i[s] == 0:
            # until the first I is known, its earliest possible arrival bounds the warm-up
            i_soonest = is_ if is_ < _INF else self.f_end[s][0] + self.round_trip[s]
            if fs < _INF and (fs + f_time <= i_soonest or (self.knobs.extra_warmup_forward and fs < i_soonest)):
                return fs, _F
            if is_ < _INF:
                return is_, _I
            return (t, _W) if has_w else (_INF, -1)
        prefer = _I if self.last_fi[s] == _F else _F
        start = {_F: fs, _I: is_}
        if start[prefer] == _INF or (self.knobs.input_grad_first and fs == is_ == t):
            prefer = _I if start[_I] < _INF else _F
        xs = start[prefer]
        if xs == _INF:
            return (t, _W) if has_w else (_INF, -1)
        gap = xs - t
        if has_w and (gap >= w_time or (self.knobs.fill_short_gaps and gap > 0 and self.idle[s] + gap > max_idle)):
            return t, _W
        return xs, prefer

    def commit(self, s: int, start: float, kind: int) -> None:
        """Run `kind` on rank s from `start`; update counters and end times."""
        duration = self.times[s][kind]
        self.idle[s] += start - self.free[s]
        end = self.free[s] = start + duration
        if kind == _F:
            mb = self.next_f[s]
            self.next_f[s] += 1
            self.f_end[s][mb] = end
            self.last_fi[s] = _F
        elif kind == _I:
            mb = self.next_i[s]
            self.next_i[s] += 1
            self.i_end[s][mb] = end
            self.pending[s].append(mb)
            self.last_fi[s] = _I
        else:
            mb = self.pending[s].popleft()
            self.w_done[s] += 1
        self.actions[s].append(Action(s, _TYPE[kind], mb))

    def run(self) -> PipelineOrder:
        """Commit the globally earliest candidate until every rank is done."""
        pp = self.pp
        total = 3 * self.m * pp
        cand = [self.candidate(s, 0.0) for s in range(pp)]
        for _ in range(total):
            starts = [c[0] for c in cand]
            best = min(starts)
            if best == _INF:
                raise ScheduleError("automatic zero-bubble scheduling got stuck; report this case")
            s = starts.index(best)
            self.commit(s, best, cand[s][1])
            max_idle = max(self.idle)
            for n in (s - 1, s, s + 1):
                if 0 <= n < pp:
                    cand[n] = self.candidate(n, max_idle)
        return {s: self.actions[s] for s in range(pp)}


def heuristic_schedule(
    costs: StageCosts, num_microbatches: int, memory_limit: int, knobs: HeuristicKnobs
) -> PipelineOrder:
    """The heuristic's order for one setting of its knobs."""
    check_problem(costs, num_microbatches, memory_limit)
    return _Greedy(costs, num_microbatches, memory_limit, knobs).run()


def _score(order: PipelineOrder, costs: StageCosts) -> tuple[float, float] | None:
    """(makespan, sum of per-rank finish times) of a valid order; None if it deadlocks."""
    try:
        result = simulate(order, costs)
    except ScheduleError:
        return None
    return result.step_time_s, sum(result.finish_s)


def _within_memory(actions: list[Action], memory_limit: int) -> bool:
    held = 0
    for a in actions:
        if a.computation_type == F:
            held += 1
            if held > memory_limit:
                return False
        elif a.computation_type == W:
            held -= 1
    return True


def _moves(acts: list[Action], reach: int):
    """(from, to) index pairs: move one action up to `reach` places without passing an action
    of its own kind (FIFO) or of its own micro-batch (F < I < W)."""
    for k, a in enumerate(acts):
        for step in (-1, 1):
            t = k
            for _ in range(reach):
                t += step
                if not 0 <= t < len(acts):
                    break
                b = acts[t]
                if b.computation_type == a.computation_type or b.microbatch_index == a.microbatch_index:
                    break
                yield k, t


def improve(
    order: PipelineOrder, costs: StageCosts, memory_limit: int, *, max_evaluations: int = 2000, reach: int = 4
) -> PipelineOrder:
    """Hill-climb: move one action of a rank up to `reach` places earlier or later.

    A move is kept when it lowers (makespan, sum of rank finish times) and respects the
    memory limit; stops at a local optimum or after `max_evaluations` simulations.
    """
    best = _score(order, costs)
    assert best is not None, "improve() needs a valid order"
    current = {r: list(acts) for r, acts in order.items()}
    evaluations = 0
    improved = True
    while improved:
        improved = False
        for r, acts in current.items():
            for k, t in _moves(list(acts), reach):
                if evaluations >= max_evaluations:
                    return current
                trial = list(acts)
                trial.insert(t, trial.pop(k))
                if not _within_memory(trial, memory_limit):
                    continue
                evaluations += 1
                score = _score({**current, r: trial}, costs)
                if score is not None and score < best:
                    best, improved = score, True
                    current[r] = trial
                    break
    return current


def _candidates(costs: StageCosts, num_microbatches: int, memory_limit: int) -> Iterator[PipelineOrder]:
    """The greedy's order for every knob setting, then the hand-crafted ZB-H1 and ZB-H2 orders
    (they need up to P and 2P-1 micro-batches of memory; the caller drops those over the limit)."""
    for flags in itertools.product((False, True), repeat=3):
        knobs = HeuristicKnobs(extra_warmup_forward=flags[0], fill_short_gaps=flags[1], input_grad_first=flags[2])
        yield _Greedy(costs, num_microbatches, memory_limit, knobs).run()
    yield zb_h1(costs.num_ranks, num_microbatches)
    yield zb_h2(costs.num_ranks, num_microbatches)


def auto_zero_bubble(
    costs: StageCosts, num_microbatches: int, memory_limit: int, *, max_evaluations: int | None = None
) -> PipelineOrder:
    """Best heuristic order over all knob settings (and ZB-H1/ZB-H2 where they fit the
    limit), then improved by `improve`; never slower than a hand-crafted order that fits.

    `costs` has one chunk per rank (vpp = 1); `memory_limit` is the most micro-batches whose
    activations a rank may hold (F start to W end): P gives ZB-H1's memory, 2P-1 ZB-H2's.
    `max_evaluations` bounds the hill-climb (0: none; default: 2000, fewer for big problems
    so that about 2e5 actions are simulated in all, under a second).
    """
    check_problem(costs, num_microbatches, memory_limit)
    best: tuple[float, float] | None = None
    best_order: PipelineOrder = {}
    for order in _candidates(costs, num_microbatches, memory_limit):
        compiled = compile_order(order)
        if max(compiled.peak_inflight) > memory_limit:
            continue
        result = simulate(compiled, costs)
        key = (result.step_time_s, sum(result.finish_s))
        if best is None or key < best:
            best, best_order = key, order
    if max_evaluations is None:
        max_evaluations = min(2000, 200_000 // (3 * costs.num_ranks * num_microbatches))
    if max_evaluations <= 0:
        return best_order
    return improve(best_order, costs, memory_limit, max_evaluations=max_evaluations)
