"""The cut solvers against brute force over every composition of the layers and every mode."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.ilp import ilp_cuts
from planner.search.partition import RankCosts, balanced_cuts, dp_cuts, split_into_chunks

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
            fitting = [costs.fixed_s[r] + n * costs.layer_s[m] for m in modes
                       if costs.fixed_bytes[r][m] + n * costs.layer_bytes[r][m] <= costs.limit_bytes]
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
        layer_bytes=tuple(tuple(sorted((draw(st.floats(0.5, 6.0)) for _ in range(num_modes)), reverse=True))
                          for _ in range(ranks)),
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
    cuts = dp_cuts(layer_s, layer_bytes, fixed_s=[0.0, 0.0], fixed_bytes=[[0.0], [0.0]],
                   limit_bytes=100.0, modes=("none",))
    assert cuts is not None
    assert cuts.layers == (4, 1) and cuts.bottleneck_s == 4.0


def test_split_into_chunks():
    assert split_into_chunks(7, 3) == [3, 2, 2]
    assert split_into_chunks(6, 2) == [3, 3]
    assert sum(split_into_chunks(13, 4)) == 13
