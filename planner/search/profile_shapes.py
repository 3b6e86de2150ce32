"""The layer shapes a `planner plan` request can ask a profile for: what
`planner profile --for-plan` measures on one node.

The search asks the cost model for the layer costs of every candidate of its space
(planner/search/space.py) before it prunes any, at the candidate's shard: TP degree,
micro-batch size, sequence length, CP degree and sequence parallelism, in each recompute
mode the candidate allows. Each shard becomes profile rows (kind, tp, mbs, seq, recompute):

  * the embedding and the head see only their own tokens: the row of the sequence shard,
    `mbs` sequences of seq / cp tokens;
  * a transformer block under CP attends its mbs * seq / cp local queries to all seq keys,
    the work of mbs / cp whole sequences: the row (tp, mbs / cp, seq), which the profile
    lookup finds at the same tokens and attention length. When mbs / cp is not a whole
    number no row of the self-attention profiler has that shape, and the calibrated model
    covers the shard (`unmeasurable`);
  * recompute "full" adds the transformer row measured under activation checkpointing
    (its saved bytes; the cost model adds the recomputed forward itself); "selective" has
    no row of its own (the profile schema measures "none" and "full"): its extra time is
    the (calibrated) analytic attention core;
  * sequence parallelism adds no row: profiles time the unsplit norms and take SP as
    measured (planner/profile/lookup.py).

Each shape carries the analytic estimate of one forward and backward on the request's GPU
preset; the list is ordered largest first, so that an interrupted run already holds the
shapes that cost most, and `cheapest` picks a budget of the cheapest shapes for a capped run
(a CPU dry run of a large model, where only the smallest real shapes are affordable).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import memory
from planner.cost.compute import AnalyticCompute
from planner.cost.model import AnalyticSource
from planner.cost.shapes import LAYER_KINDS, Shard
from planner.profile.schema import ShapeKey
from planner.search.space import SearchSpace, candidates
from planner.spec import Cluster, ModelSpec

_PARAMS = {
    "embedding": memory.embedding_param_count,
    "transformer": memory.transformer_param_count,
    "head": memory.head_param_count,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedShape:
    """One profile row a plan request can use, with the analytic cost of measuring it."""

    key: ShapeKey
    estimate_s: float
    """Analytic forward + backward seconds of one pass on the request's GPU preset (with
    the recomputed forward under recompute "full")."""
    param_count: float
    """Parameters of the layer on one GPU (what building it costs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapePlan:
    """The rows a request can use, largest first, and the shards no row can describe."""

    shapes: tuple[PlannedShape, ...]
    unmeasurable: tuple[str, ...]
    """Transformer shards under CP with fewer local tokens than one sequence, described."""


def plan_shapes(
    spec: ModelSpec,
    cluster: Cluster,
    global_batch: int,
    seq: int,
    space: SearchSpace,
    kinds: tuple[str, ...] = LAYER_KINDS,
    dtype: str = "bf16",
) -> ShapePlan:
    """Every profile row the search of this request can ask for (see the module docstring)."""
    keys: set[ShapeKey] = set()
    unmeasurable: set[tuple[int, int, int]] = set()
    seen: set[tuple[int, int, int, tuple[str, ...]]] = set()
    for candidate in candidates(spec, cluster, global_batch, seq, space):
        shard = (candidate.tp, candidate.mbs, candidate.cp, candidate.modes)
        if shard in seen:
            continue
        seen.add(shard)
        tp, mbs, cp, modes = shard
        for kind in ("embedding", "head"):
            keys.add(ShapeKey(kind, tp, mbs, seq // cp, "none"))
        if mbs % cp:
            unmeasurable.add((tp, mbs, cp))
            continue
        for mode in ("none", "full"):
            if mode == "none" or mode in modes:
                keys.add(ShapeKey("transformer", tp, mbs // cp, seq, mode))
    source = AnalyticSource(spec, AnalyticCompute(cluster.gpu, dtype))
    shapes = [_planned(spec, source, key) for key in keys if key.kind in kinds]
    shapes.sort(key=lambda s: (-s.estimate_s, -s.param_count, s.key))
    notes = (
        tuple(
            f"transformer tp={tp} mbs={mbs} seq={seq} cp={cp} ({mbs * seq // cp} tokens attending to {seq})"
            for tp, mbs, cp in sorted(unmeasurable)
        )
        if "transformer" in kinds
        else ()
    )
    return ShapePlan(shapes=tuple(shapes), unmeasurable=notes)


def cheapest(shapes: tuple[PlannedShape, ...], count: int) -> tuple[PlannedShape, ...]:
    """The `count` shapes cheapest to measure (by estimate, then parameters), largest first."""
    chosen = set(sorted(shapes, key=lambda s: (s.estimate_s, s.param_count, s.key))[:count])
    return tuple(s for s in shapes if s in chosen)


def _planned(spec: ModelSpec, source: AnalyticSource, key: ShapeKey) -> PlannedShape:
    times = source.layer_times(key.kind, Shard(mbs=key.mbs, seq=key.seq, tp=key.tp))
    recompute = times.forward_s if key.recompute == "full" else 0.0
    return PlannedShape(
        key=key, estimate_s=times.forward_s + times.backward_s + recompute, param_count=_PARAMS[key.kind](spec, key.tp)
    )
