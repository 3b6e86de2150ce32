"""Branch and bound over the layout space: the best `top` layouts of the cost model.

1. Enumerate the candidates (planner/search/space.py). Each gets a memory floor (its
   state and in-flight activations under the best possible cuts, in closed form) and a
   step-time floor (the chain bound with the cheapest recompute mode and the Adam step);
   candidates over the memory limit go.
2. Visit the rest in order of their step floor. Once `top` plans are known, a candidate
   whose floor is not below the slowest of them cannot enter, and neither can any later one:
   the search stops there. A candidate whose round-trip floor (few micro-batches on many
   virtual stages) is not below it is passed over.
3. For a visited candidate, the cut solver gives the cuts and per-rank recompute modes that
   minimise the slowest rank's time within memory; the even cuts of `planner evaluate` in
   each recompute mode are tried too, so the answer is never worse than evaluating every
   layout of the space with even cuts. Each layout's memory floor and chain bound (cut
   points known) are checked, then, when it fits, its sequencing bound, before its schedule
   is simulated by `planner.predict`, whose memory figure has the last word on fitting.

Nothing is lost by the bounds: each is a lower bound of the simulated step time or memory.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from planner.cost.model import CostModel
from planner.layout import Layout
from planner.pipeline import ChunkCosts
from planner.predict import (
    Prediction,
    after_backward_times,
    chunk_costs,
    exposed_dp_times,
    predict,
    replica_sync_times,
)
from planner.schedule import SCHEDULES, schedule_info
from planner.search.bounds import layout_bound, sequencing_bound
from planner.search.costing import (
    Parts,
    even_layouts,
    excess_memory,
    inflight_of,
    layout_memory_floor,
    memory_floor,
    parts_of,
    rank_costs,
    round_trip_floor,
    solved_layout,
    step_floor,
)
from planner.search.ilp import ilp_cuts
from planner.search.partition import exact_cuts
from planner.search.space import Candidate, SearchSpace, candidates

CUT_SOLVERS = ("exact", "ilp")
"""`exact`: bisection on the bottleneck (planner/search/partition.py); `ilp`: pulp/CBC for
identical layers (layers of two kinds take the exact solver)."""
MEMORY_RETRIES = 3
"""Times the solver's cuts are re-solved under a tighter limit when `predict` finds them
over memory (V > 1 spreads in-flight activations unevenly over a rank's chunks)."""

Accept = Callable[[Layout], str | None]
"""A runtime's check of a layout: None if it can run it, else why not."""
Progress = Callable[[int, int], None]
"""Called with (candidates visited, candidates to visit)."""


@dataclass(slots=True)
class SearchStats:
    """What happened to the candidates, and to the layouts the solved ones gave.

    Each candidate ends in one of `pruned_memory`, `pruned_bound` and `solved`; each layout
    (cut points and recompute modes known) in one of `out_of_memory`, `layouts_pruned_bound`,
    `simulated_out_of_memory`, `rejected_by_runtime` and `fitted`. `simulated` is the sum of
    the last three."""

    candidates: int = 0
    pruned_memory: int = 0
    """Candidates whose state alone (the memory floor) is over the memory limit."""
    pruned_bound: int = 0
    """Candidates cut by their step-time floor before any cut points were solved."""
    solved: int = 0
    """Candidates whose cut points were solved: they gave the layouts."""
    layouts: int = 0
    """Distinct layouts the solved candidates gave."""
    out_of_memory: int = 0
    """Layouts over the memory limit before simulation (memory floor or activation need)."""
    layouts_pruned_bound: int = 0
    """Layouts cut by a step-time bound (never simulated)."""
    simulated_out_of_memory: int = 0
    """Simulated layouts whose simulated peak is over the memory limit."""
    rejected_by_runtime: int = 0
    """Simulated layouts that fit but that the runtime (or the profile) refuses."""
    fitted: int = 0
    """Simulated layouts that fit and are accepted: those compared for the best plans."""
    seconds: float = 0.0

    @property
    def simulated(self) -> int:
        """Layouts simulated: over memory once simulated, refused, or fit."""
        return self.simulated_out_of_memory + self.rejected_by_runtime + self.fitted


@dataclass(frozen=True, slots=True)
class Found:
    """One plan: its layout and prediction."""

    layout: Layout
    prediction: Prediction


@dataclass(slots=True)
class SearchResult:
    """The best plans (fastest first), the statistics, and the smallest memory need seen."""

    plans: list[Found]
    stats: SearchStats
    smallest_need_bytes: float = float("inf")
    """Least predicted (or floor) memory of any layout examined, for infeasible requests."""
    smallest_need: Layout | Candidate | None = None
    runtime_rejections: dict[str, int] = field(default_factory=dict)


def search(
    model: CostModel,
    global_batch: int,
    seq: int,
    space: SearchSpace = SearchSpace(),
    top: int = 5,
    accept: Accept | None = None,
    cut_solver: str = "exact",
    progress: Progress | None = None,
) -> SearchResult:
    """The `top` fastest layouts of the space that fit in memory (and that `accept` allows)."""
    with _no_cycle_collection():
        return _search(model, global_batch, seq, space, top, accept, cut_solver, progress)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: the search allocates hundreds of thousands of
    short-lived acyclic objects, which reference counting frees, and the collector's passes
    over them cost about a tenth of the run."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _search(
    model: CostModel,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    top: int,
    accept: Accept | None,
    cut_solver: str,
    progress: Progress | None,
) -> SearchResult:
    started = time.perf_counter()
    run = _Run(model, global_batch, seq, top, accept, cut_solver)
    stats = run.result.stats
    queue: list[tuple[float, int, Candidate, Parts]] = []
    for index, candidate in enumerate(candidates(model.spec, model.cluster, global_batch, seq, space)):
        stats.candidates += 1
        parts = parts_of(model, candidate, seq)
        floor = memory_floor(model, candidate, parts, inflight_of(candidate))
        if floor > run.limit:
            stats.pruned_memory += 1
            run.note_need(floor, candidate)
            continue
        queue.append((step_floor(model, candidate, parts), index, candidate, parts))
    queue.sort(key=lambda item: (item[0], item[1]))
    total = len(queue)
    for visited, (floor, index, candidate, parts) in enumerate(queue):
        if progress is not None and visited % 64 == 0:
            progress(visited, total)
        if floor >= run.threshold():
            stats.pruned_bound += total - visited
            break
        if round_trip_floor(model, candidate, parts) >= run.threshold():
            stats.pruned_bound += 1
            continue
        stats.solved += 1
        run.visit(index, candidate, parts)
    if progress is not None:
        progress(total, total)
    run.result.plans = [found for _, _, found in run.best]
    stats.seconds = time.perf_counter() - started
    return run.result


class _Run:
    """The state of one search: the best plans so far and what was seen."""

    def __init__(self, model: CostModel, global_batch: int, seq: int, top: int, accept: Accept | None, cut_solver: str):
        if cut_solver not in CUT_SOLVERS:
            raise ValueError(f"cut_solver must be one of {CUT_SOLVERS}, got {cut_solver!r}")
        self.model, self.global_batch, self.seq, self.top = model, global_batch, seq, top
        self.accept, self.cut_solver = accept, cut_solver
        self.limit = model.cluster.memory_limit_bytes
        self.result = SearchResult(plans=[], stats=SearchStats())
        self.best: list[tuple[float, int, Found]] = []
        self.seen: set[Layout] = set()

    def threshold(self) -> float:
        """Step time a layout must beat to enter the best plans."""
        return self.best[-1][0] if len(self.best) >= self.top else float("inf")

    def visit(self, index: int, candidate: Candidate, parts: Parts) -> None:
        """Try the solver's cuts (re-solved under a tighter limit while V > 1 overshoots)
        and the even cuts of the candidate."""
        model, layers = self.model, self.model.spec.num_layers
        inflight = inflight_of(candidate)
        memory_floor_of = layout_memory_floor(model, candidate, parts, inflight)
        target = self.limit
        for _ in range(0 if candidate.empty_ends else MEMORY_RETRIES):
            costs = rank_costs(model, candidate, parts, inflight, target)
            # the MILP takes identical layers; layers of two kinds go to their exact solver
            solve = ilp_cuts if self.cut_solver == "ilp" and not costs.layer_kinds else exact_cuts
            cuts = solve(costs, layers)
            if cuts is None:
                break
            peak = self.consider(index, solved_layout(candidate, cuts, layers), memory_floor_of)
            if peak is None or peak <= self.limit or candidate.vpp == 1:
                break
            target -= (peak - self.limit) * 1.01
        for mode, layout in enumerate(even_layouts(candidate, layers)):
            if step_floor(model, candidate, parts, mode) < self.threshold():
                self.consider(index, layout, memory_floor_of)

    def consider(self, index: int, layout: Layout, memory_floor_of: Callable[[Layout], float]) -> float | None:
        """Bound, simulate and keep the layout if it is among the best; its peak memory (or
        `memory_floor_of` it when that is already over), or None when it was not simulated."""
        if layout in self.seen:
            return None
        self.seen.add(layout)
        stats = self.result.stats
        stats.layouts += 1
        floor = memory_floor_of(layout)
        if floor > self.limit:
            stats.out_of_memory += 1
            self.note_need(floor, layout)
            return floor
        costs = chunk_costs(self.model, layout, self.seq)
        bounds = _LayoutBounds(self.model, layout, costs)
        if bounds.chain(self.threshold()) >= self.threshold():
            stats.layouts_pruned_bound += 1
            return None
        need = excess_memory(self.model, layout, costs)
        if need is not None:
            stats.out_of_memory += 1
            self.note_need(need, layout)
            return need
        # fits: before simulating, the bound of any action order (tighter, dearer to compute)
        if bounds.sequencing() >= self.threshold():
            stats.layouts_pruned_bound += 1
            return None
        prediction = predict(self.model, layout, self.global_batch, self.seq, costs)
        peak = prediction.peak_memory_bytes
        if peak > self.limit:
            stats.simulated_out_of_memory += 1
            self.note_need(peak, layout)
            return peak
        reason = self.accept(layout) if self.accept is not None else None
        if reason is not None:
            stats.rejected_by_runtime += 1
            self.result.runtime_rejections[reason] = self.result.runtime_rejections.get(reason, 0) + 1
            return peak
        stats.fitted += 1
        bisect.insort(
            self.best, (prediction.step_time_s, index, Found(layout, prediction)), key=lambda item: (item[0], item[1])
        )
        del self.best[self.top :]
        return peak

    def note_need(self, need: float, where: Layout | Candidate) -> None:
        """Remember the smallest memory need seen, for an infeasible request."""
        if need < self.result.smallest_need_bytes:
            self.result.smallest_need_bytes = need
            self.result.smallest_need = where


def _bound(model: CostModel, layout: Layout, costs: ChunkCosts, threshold: float = float("inf")) -> float:
    """`_LayoutBounds.chain` of the layout."""
    return _LayoutBounds(model, layout, costs).chain(threshold)


class _LayoutBounds:
    """Lower bounds of one layout's predicted step (cut points known), each costing the
    exposed DP communication and the step's tail once."""

    def __init__(self, model: CostModel, layout: Layout, costs: ChunkCosts):
        self.model, self.layout, self.costs = model, layout, costs
        self._after: list[float] | None = None
        self.tail = sum(after_backward_times(model, layout, costs.params, costs.expert_params).values())
        """The step's tail after the backward: loss-scale check, gradient norm, Adam step."""

    def after(self) -> list[float]:
        """Per rank, what it runs after its last action: exposed DP communication (and
        chimera's replica gradient sync)."""
        if self._after is None:
            model, layout, costs = self.model, self.layout, self.costs
            self._after = [
                dp + sync
                for dp, sync in zip(exposed_dp_times(model, layout, costs), replica_sync_times(model, layout, costs))
            ]
        return self._after

    def chain(self, threshold: float = float("inf")) -> float:
        """Chain bound of the layout with each rank's exposed DP communication, plus the
        step's tail. When the bound without the DP terms already reaches `threshold` that
        one is returned: it is no larger (`layout_bound` grows with each rank's time after
        its last action) and prunes the layout all the same, without costing the DP
        collectives of every rank."""
        layout, costs = self.layout, self.costs
        split = SCHEDULES[layout.schedule].split_backward and layout.pp > 1
        bidirectional = schedule_info(layout.schedule).bidirectional and layout.pp > 1
        without_dp = layout_bound(costs, layout.num_microbatches, split, bidirectional=bidirectional) + self.tail
        if without_dp >= threshold:
            return without_dp
        return (
            layout_bound(costs, layout.num_microbatches, split, self.after(), bidirectional=bidirectional) + self.tail
        )

    def sequencing(self) -> float:
        """`sequencing_bound` with each rank's exposed DP communication, plus the step's
        tail, shaved by a relative 1e-9 against rounding (its paths sum the simulator's
        terms in another order, and may equal its step); the chain bound under chimera."""
        layout = self.layout
        if schedule_info(layout.schedule).bidirectional and layout.pp > 1:
            return self.chain()
        bound = sequencing_bound(
            self.costs,
            layout.num_microbatches,
            SCHEDULES[layout.schedule].split_backward,
            SCHEDULES[layout.schedule].v_shaped,
            self.after(),
        )
        return (bound + self.tail) * (1 - ROUNDING_MARGIN)


ROUNDING_MARGIN = 1e-9
"""Relative share `_LayoutBounds.sequencing` gives up so that float rounding cannot lift it
over the step it bounds."""
