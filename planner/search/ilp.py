"""Cut points and per-rank recompute modes jointly, as a mixed-integer program (pulp, solved
by `planner.milp.mip_solver`: CBC when installed, else HiGHS).

Same problem and objective as planner/search/partition.py: with x[r,m] = 1 when rank r
runs mode m and n[r,m] its layers in that mode,

    minimise T
    s.t.  sum_m x[r,m] = 1                                     one mode per rank
          min_layers * x[r,m] <= n[r,m] <= L * x[r,m]
          sum_{r,m} n[r,m] = L                                 every layer placed once
          e_r + sum_m t_m n[r,m] <= T                          bottleneck
          sum_m (c_r[m] x[r,m] + b_r[m] n[r,m]) <= limit       memory of rank r
"""

from __future__ import annotations

from planner.search.partition import Cuts, RankCosts


def ilp_cuts(costs: RankCosts, num_layers: int, time_limit_s: float = 30.0) -> Cuts | None:
    """Optimal cuts and modes by MILP; None when the program is infeasible."""
    import pulp  # with numpy under highspy: loaded when a program is solved, not at CLI start

    from planner.milp import mip_solver

    ranks, modes = range(costs.num_ranks), range(len(costs.modes))
    problem = pulp.LpProblem("stage_cuts", pulp.LpMinimize)
    bottleneck = problem.add_variable("T", lowBound=0)
    pick = {(r, m): problem.add_variable(f"x_{r}_{m}", cat=pulp.LpBinary) for r in ranks for m in modes}
    count = {
        (r, m): problem.add_variable(f"n_{r}_{m}", lowBound=0, upBound=num_layers, cat=pulp.LpInteger)
        for r in ranks
        for m in modes
    }
    problem += bottleneck
    problem += pulp.lpSum(count.values()) == num_layers
    scale = max(costs.limit_bytes, 1.0)  # bytes in units of the limit keep the rows well scaled
    for r in ranks:
        problem += pulp.lpSum(pick[r, m] for m in modes) == 1
        for m in modes:
            problem += count[r, m] <= num_layers * pick[r, m]
            problem += count[r, m] >= costs.min_layers * pick[r, m]
        problem += costs.fixed_s[r] + pulp.lpSum(costs.layer_s[m] * count[r, m] for m in modes) <= bottleneck
        problem += (
            pulp.lpSum(
                (costs.fixed_bytes[r][m] / scale) * pick[r, m] + (costs.layer_bytes[r][m] / scale) * count[r, m]
                for m in modes
            )
            <= costs.limit_bytes / scale
        )
    status = problem.solve(mip_solver(time_limit_s))
    if pulp.LpStatus[status] != "Optimal":
        return None
    layers, chosen = [], []
    for r in ranks:
        m = max(modes, key=lambda k: pick[r, k].value() or 0.0)
        layers.append(round(count[r, m].value() or 0.0))
        chosen.append(costs.modes[m])
    value = max(costs.fixed_s[r] + layers[r] * costs.layer_s[costs.modes.index(chosen[r])] for r in ranks)
    return Cuts(layers=tuple(layers), modes=tuple(chosen), bottleneck_s=value)
