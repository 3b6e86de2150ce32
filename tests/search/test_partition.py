"""The cut solvers against brute force over every composition of the layers and every mode."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.ilp import ilp_cuts
from planner.search.partition import (
    RankCosts,
    balanced_cuts,
    dp_cuts,
    exact_cuts,
    sequence_cuts,
    split_into_chunks,
)

MODES = ("none", "selective", "full")


def brute_force(costs: RankCosts, num_layers: int) -> float | None:
    """Least bottleneck over every (layers per rank, mode per rank) that fits, or None."""
    best = math.inf
    ranks, modes = costs.num_ranks, range(len(costs.modes))
    for cut in itertools.combinations(range(1, num_layers), ranks - 1):
        counts = [b - a for a, b in zip((0, *cut), (*cut, num_layers))]
        if min(counts) < costs.min_layers:
            continue
        value = 0.0
        for r, n in enumerate(counts):
            fitting = [
                costs.fixed_s[r] + n * costs.layer_s[m]
                for m in modes
                if costs.fixed_bytes[r][m] + n * costs.layer_bytes[r][m] <= costs.limit_bytes
            ]
            if not fitting:
                value = math.inf
                break
            value = max(value, min(fitting))
        best = min(best, value)
    return None if best == math.inf else best


@st.composite
def problems(draw):
    ranks = draw(st.integers(1, 4))
    layers = draw(st.integers(ranks, 10))
    num_modes = draw(st.integers(1, 3))
    time = st.floats(0.5, 3.0)
    base = sorted(draw(st.lists(time, min_size=num_modes, max_size=num_modes)))
    costs = RankCosts(
        modes=MODES[:num_modes],
        fixed_s=tuple(draw(st.floats(0.0, 4.0)) for _ in range(ranks)),
        fixed_bytes=tuple(tuple(draw(st.floats(0.0, 10.0)) for _ in range(num_modes)) for _ in range(ranks)),
        layer_s=tuple(base),
        # slower modes save memory, as recompute does
        layer_bytes=tuple(
            tuple(sorted((draw(st.floats(0.5, 6.0)) for _ in range(num_modes)), reverse=True)) for _ in range(ranks)
        ),
        limit_bytes=draw(st.floats(5.0, 60.0)),
        min_layers=draw(st.integers(1, 2)),
    )
    return costs, layers


def _check(cuts, costs: RankCosts, layers: int, expected: float | None) -> None:
    if expected is None:
        assert cuts is None
        return
    assert cuts is not None
    assert sum(cuts.layers) == layers and min(cuts.layers) >= costs.min_layers
    assert math.isclose(cuts.bottleneck_s, expected, rel_tol=1e-9, abs_tol=1e-9)
    for r, (n, mode) in enumerate(zip(cuts.layers, cuts.modes)):  # the answer itself is feasible
        m = costs.modes.index(mode)
        assert costs.fixed_bytes[r][m] + n * costs.layer_bytes[r][m] <= costs.limit_bytes * (1 + 1e-9)
        assert costs.fixed_s[r] + n * costs.layer_s[m] <= cuts.bottleneck_s * (1 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_balanced_cuts_is_optimal(problem):
    costs, layers = problem
    _check(balanced_cuts(costs, layers), costs, layers, brute_force(costs, layers))


@settings(max_examples=100, deadline=None)
@given(problems())
def test_dynamic_programming_is_optimal(problem):
    costs, layers = problem
    modes = range(len(costs.modes))
    cuts = dp_cuts(
        layer_s=[[costs.layer_s[m]] * layers for m in modes],
        layer_bytes=[[[costs.layer_bytes[r][m]] * layers for m in modes] for r in range(costs.num_ranks)],
        fixed_s=list(costs.fixed_s),
        fixed_bytes=[list(row) for row in costs.fixed_bytes],
        limit_bytes=costs.limit_bytes,
        modes=costs.modes,
        min_layers=costs.min_layers,
    )
    _check(cuts, costs, layers, brute_force(costs, layers))


@settings(max_examples=25, deadline=None)
@given(problems())
def test_ilp_is_optimal(problem):
    costs, layers = problem
    _check(ilp_cuts(costs, layers), costs, layers, brute_force(costs, layers))


def test_dynamic_programming_with_layers_that_differ():
    """A heavy last layer (e.g. a wide MoE block) pulls the cut forward: checked by hand."""
    layer_s = [[1.0, 1.0, 1.0, 1.0, 4.0]]
    layer_bytes = [[[1.0] * 5], [[1.0] * 5]]
    cuts = dp_cuts(
        layer_s, layer_bytes, fixed_s=[0.0, 0.0], fixed_bytes=[[0.0], [0.0]], limit_bytes=100.0, modes=("none",)
    )
    assert cuts is not None
    assert cuts.layers == (4, 1) and cuts.bottleneck_s == 4.0


def test_split_into_chunks():
    assert split_into_chunks(7, 3) == [3, 2, 2]
    assert split_into_chunks(6, 2) == [3, 3]
    assert sum(split_into_chunks(13, 4)) == 13


def brute_force_sequence(costs: RankCosts) -> float | None:
    """Least bottleneck over every contiguous cut and mode per rank, each layer costed by its
    kind (`layer_kinds`), or None when nothing fits."""
    kinds, ranks, modes = costs.layer_kinds, costs.num_ranks, range(len(costs.modes))
    num_layers, best = len(kinds), math.inf
    for cut in itertools.combinations(range(1, num_layers), ranks - 1):
        bounds = list(zip((0, *cut), (*cut, num_layers)))
        if min(b - a for a, b in bounds) < costs.min_layers:
            continue
        value = 0.0
        for r, (a, b) in enumerate(bounds):
            fitting = [
                costs.fixed_s[r] + sum(costs.kind_s[k][m] for k in kinds[a:b])
                for m in modes
                if costs.fixed_bytes[r][m] + sum(costs.kind_bytes[r][k][m] for k in kinds[a:b]) <= costs.limit_bytes
            ]
            value = max(value, min(fitting, default=math.inf))
        best = min(best, value)
    return None if best == math.inf else best


@st.composite
def sequence_problems(draw):
    costs, layers = draw(problems())
    num_modes, ranks = len(costs.modes), costs.num_ranks
    kinds = tuple(draw(st.lists(st.integers(0, 1), min_size=layers, max_size=layers)))
    other_s = tuple(sorted(draw(st.lists(st.floats(0.2, 5.0), min_size=num_modes, max_size=num_modes))))
    other_bytes = tuple(
        tuple(sorted((draw(st.floats(0.5, 9.0)) for _ in range(num_modes)), reverse=True)) for _ in range(ranks)
    )
    return replace(
        costs,
        layer_kinds=kinds,
        kind_s=(costs.layer_s, other_s),
        kind_bytes=tuple((own, other) for own, other in zip(costs.layer_bytes, other_bytes)),
    )


@settings(max_examples=150, deadline=None)
@given(sequence_problems())
def test_sequence_cuts_is_optimal(costs):
    expected = brute_force_sequence(costs)
    cuts = sequence_cuts(costs)
    if expected is None:
        assert cuts is None
        return
    assert cuts is not None
    assert sum(cuts.layers) == len(costs.layer_kinds) and min(cuts.layers) >= costs.min_layers
    assert math.isclose(cuts.bottleneck_s, expected, rel_tol=1e-9, abs_tol=1e-9)
    start = 0
    for r, (n, mode) in enumerate(zip(cuts.layers, cuts.modes)):  # the answer itself is feasible
        m, kinds = costs.modes.index(mode), costs.layer_kinds[start : start + n]
        assert costs.fixed_bytes[r][m] + sum(costs.kind_bytes[r][k][m] for k in kinds) <= costs.limit_bytes * (1 + 1e-9)
        assert costs.fixed_s[r] + sum(costs.kind_s[k][m] for k in kinds) <= cuts.bottleneck_s * (1 + 1e-9)
        start += n


def test_sequence_cuts_give_cheap_leading_layers_to_the_first_rank():
    """Three cheap layers (DeepSeek-V3's dense ones) then six heavy ones on two ranks: the
    first rank takes the cheap three and two heavy (3 + 2 x 2 = 7 against 4 x 2 = 8), by hand."""
    costs = RankCosts(
        modes=("none",),
        fixed_s=(0.0, 0.0),
        fixed_bytes=((0.0,), (0.0,)),
        layer_s=(2.0,),
        layer_bytes=((1.0,), (1.0,)),
        limit_bytes=100.0,
        layer_kinds=(1, 1, 1, 0, 0, 0, 0, 0, 0),
        kind_s=((2.0,), (1.0,)),
        kind_bytes=(((1.0,), (1.0,)), ((1.0,), (1.0,))),
    )
    cuts = exact_cuts(costs, 9)
    assert cuts is not None and cuts.layers == (5, 4) and cuts.bottleneck_s == 8.0
