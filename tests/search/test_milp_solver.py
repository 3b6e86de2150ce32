"""The MILP solver goes through pulp's non-deprecated API (pulp 3.3 warns that
PULP_CBC_CMD and bare LpVariable(...) go away in 4.0) and proves optima."""

from __future__ import annotations

import itertools
import warnings

import pulp

from planner.milp import mip_solver
from planner.schedule import StageCosts, optimal_schedule, simulate
from planner.search.ilp import ilp_cuts
from planner.search.partition import RankCosts


def _knapsack(solver) -> tuple[float, list[int]]:
    values, weights, capacity = [10, 13, 7, 8, 4], [5, 6, 3, 4, 2], 10
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    take = [prob.add_variable(f"x{i}", 0, 1, cat=pulp.LpBinary) for i in range(len(values))]
    prob += pulp.lpSum(v * x for v, x in zip(values, take))
    prob += pulp.lpSum(w * x for w, x in zip(weights, take)) <= capacity
    assert pulp.LpStatus[prob.solve(solver)] == "Optimal"
    return pulp.value(prob.objective), [round(x.value()) for x in take]


def test_solver_proves_the_brute_force_optimum_without_deprecation_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        best, chosen = _knapsack(mip_solver(10.0))
    values, weights = [10, 13, 7, 8, 4], [5, 6, 3, 4, 2]
    brute = max(
        sum(v for v, t in zip(values, pick) if t)
        for pick in itertools.product((0, 1), repeat=5)
        if sum(w for w, t in zip(weights, pick) if t) <= 10
    )
    assert best == brute and sum(w for w, t in zip(weights, chosen) if t) <= 10


def test_planner_milps_run_without_deprecation_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        costs = StageCosts.uniform(2, 1, 1.0, 1.0, 1.0)
        order = optimal_schedule(costs, 4, 2)
        assert simulate(order, costs).step_time_s > 0
        cuts = ilp_cuts(
            RankCosts(
                modes=("none",),
                layer_s=(1.0,),
                fixed_s=(0.0, 0.0),
                layer_bytes=((1.0,), (1.0,)),
                fixed_bytes=((0.0,), (0.0,)),
                limit_bytes=10.0,
                min_layers=1,
            ),
            4,
        )
        assert cuts is not None and cuts.layers == (2, 2)
