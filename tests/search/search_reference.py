"""References the search tests compare `search` with: the schedules a brute force tries on a
pipeline, a brute force over the search's own candidates with even cuts, the check that the
search's best plan is no worse than a reference and is what `predict` says it is, and the
hypothesis draw of any layout of a candidate."""

from __future__ import annotations

import math
from collections.abc import Iterator

from hypothesis import strategies as st

from planner.cost.model import CostModel
from planner.errors import ScheduleError
from planner.layout import Layout, check_layout, even_stage_layers, stage_layers_from_counts
from planner.plan import RECOMPUTE_MODES
from planner.predict import predict
from planner.schedule import check_shape
from planner.search.costing import layout_of
from planner.search.search import SearchResult
from planner.search.space import Candidate, SearchSpace, candidates


def pipeline_schedules(space: SearchSpace, pp: int, m: int, num_layers: int) -> Iterator[tuple[str, int]]:
    """(schedule, V) of the space that run `m` micro-batches on `pp` ranks of `num_layers`
    layers: 1F1B alone without a pipeline, each schedule's own shape rules otherwise."""
    for name in space.schedules:
        for vpp in space.vpp:
            if pp == 1 and (name, vpp) != ("1f1b", 1):
                continue
            try:
                check_shape(name, pp, m, vpp)
            except ScheduleError:
                continue
            if pp * vpp <= num_layers:
                yield name, vpp


def even_cut_reference(model: CostModel, batch: int, seq: int, space: SearchSpace) -> float:
    """Least predicted step time over every candidate of the space with even cuts, in each
    recompute mode on every rank, that fits."""
    spec, best = model.spec, math.inf
    for c in candidates(spec, model.cluster, batch, seq, space):
        if c.empty_ends:
            continue
        for mode in RECOMPUTE_MODES:
            layout = Layout(
                tp=c.tp,
                pp=c.pp,
                dp=c.dp,
                cp=c.cp,
                vpp=c.vpp,
                mbs=c.mbs,
                num_microbatches=c.num_microbatches,
                schedule=c.schedule,
                recompute=(mode,) * c.pp,
                sequence_parallel=c.sequence_parallel,
                zero_stage=c.zero_stage,
                segments=c.segments,
                ep=c.ep,
                etp=c.etp,
                stage_layers=even_stage_layers(spec.num_layers, c.pp, c.vpp, c.schedule),
            )
            check_layout(layout, spec, model.cluster, batch, seq)
            p = predict(model, layout, batch, seq)
            if p.peak_memory_bytes <= model.cluster.memory_limit_bytes:
                best = min(best, p.step_time_s)
    return best


def assert_never_worse(model: CostModel, result: SearchResult, reference: float, batch: int, seq: int) -> None:
    """The search's best plan is no slower than `reference`, and `predict` gives it the same
    step time and a peak that fits."""
    best = result.plans[0]
    assert best.prediction.step_time_s <= reference * (1 + 1e-12)
    again = predict(model, best.layout, batch, seq)
    assert again.step_time_s == best.prediction.step_time_s
    assert again.peak_memory_bytes <= model.cluster.memory_limit_bytes


def draw_layout(data, candidate: Candidate, num_layers: int) -> Layout:
    """A layout of `candidate` drawn by hypothesis's `data`: any cuts (at least one layer per
    chunk, or empty end stages for such candidates) and any recompute mode per rank."""
    pp, vpp = candidate.pp, candidate.vpp
    inner = pp * vpp - (2 if candidate.empty_ends else 0)
    cuts = sorted(
        data.draw(st.lists(st.integers(1, num_layers - 1), min_size=inner - 1, max_size=inner - 1, unique=True))
    )
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, num_layers])]
    if candidate.empty_ends:
        counts = [0, *counts, 0]
    recompute = tuple(data.draw(st.sampled_from(candidate.modes)) for _ in range(pp))
    return layout_of(candidate, stage_layers_from_counts(counts, num_layers, pp, vpp, candidate.schedule), recompute)
