"""Exact zero-bubble scheduling as a MILP (Qi et al. 2024, section 3.2), solved with pulp.

Variables: the start time of every F, I, W of every (rank, micro-batch) for one chunk per
rank, a binary order for every pair of passes on a rank whose order is not already forced,
and the makespan C. Constraints:

- F(s, j) starts after F(s-1, j) ends + p2p; I(s, j) after I(s+1, j) ends + p2p (after
  F(P-1, j) on the last rank); W(s, j) after I(s, j);
- each rank runs its F's, its I's and its W's in micro-batch order (FIFO; the space of the
  paper's hand-crafted schedules and of `auto_zb`), so only F(j)/I(k), F(j)/W(k) and
  I(j)/W(k) with k < j need an order binary (a big-M disjunction);
- memory: when F(s, j) starts, j + 1 - #{W(s, k) finished before it} <= memory_limit;
- C >= the end of each rank's last W, and C >= start of F(s, 0) + all of rank s's work;
  minimise C (the synchronous step makespan).

To make the solver fast the heuristic's schedule is the warm start (CBC) and its makespan the horizon
H; each pass gets a window [earliest, latest] start (precedence chains from 0 and back from
H), and each disjunction its own big-M from those windows (forcing the order outright when
the windows do not overlap). The optimum's order, re-simulated ASAP, has exactly the
optimal makespan. Meant for small P x M (P <= 4, M <= 6 solve in seconds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.errors import ScheduleError
from planner.schedule.actions import Action, F, I, PipelineOrder, W
from planner.schedule.auto_zb import auto_zero_bubble, check_problem, stage_times
from planner.schedule.costs import StageCosts
from planner.schedule.simulate import simulate

if TYPE_CHECKING:  # pulp (and numpy under highspy) load when a program is solved, not at CLI start
    import pulp

_PAIRS = ((0, 1), (0, 2), (1, 2))
"""(kind of micro-batch j, kind of micro-batch k < j) pairs whose order is free: F/I, F/W, I/W."""

Key = tuple[int, int, int]


def _variable(prob: pulp.LpProblem, name: str, low: float, up: float, cat: str = "Continuous") -> pulp.LpVariable:
    """A variable of `prob` (pulp 3.3's `add_variable`; the bare constructor is deprecated)."""
    return prob.add_variable(name, low, up, cat=cat)


def _windows(
    times: list[tuple[float, float, float]], m: int, p2p: float, horizon: float
) -> tuple[dict[Key, float], dict[Key, float]]:
    """Earliest and latest start of every (rank, kind, micro-batch) pass within `horizon`."""
    pp = len(times)
    early: dict[Key, float] = {}
    for j in range(m):
        for s in range(pp):
            prev = early[(s - 1, 0, j)] + times[s - 1][0] + p2p if s else 0.0
            early[(s, 0, j)] = max(prev, early[(s, 0, j - 1)] + times[s][0] if j else 0.0)
    for j in range(m):
        for s in reversed(range(pp)):
            after = early[(s + 1, 1, j)] + times[s + 1][1] + p2p if s < pp - 1 else early[(s, 0, j)] + times[s][0]
            early[(s, 1, j)] = max(after, early[(s, 1, j - 1)] + times[s][1] if j else 0.0)
            early[(s, 2, j)] = max(early[(s, 1, j)] + times[s][1], early[(s, 2, j - 1)] + times[s][2] if j else 0.0)
    late: dict[Key, float] = {}
    for j in reversed(range(m)):
        for s in range(pp):
            late[(s, 2, j)] = horizon - (m - j) * times[s][2]
            bound = min(late[(s, 2, j)], late[(s - 1, 1, j)] - p2p if s else horizon) - times[s][1]
            late[(s, 1, j)] = min(bound, late[(s, 1, j + 1)] - times[s][1] if j < m - 1 else bound)
        for s in reversed(range(pp)):
            bound = min(late[(s, 1, j)], late[(s + 1, 0, j)] - p2p if s < pp - 1 else horizon) - times[s][0]
            late[(s, 0, j)] = min(bound, late[(s, 0, j + 1)] - times[s][0] if j < m - 1 else bound)
    return early, late


def optimal_schedule(
    costs: StageCosts,
    num_microbatches: int,
    memory_limit: int,
    *,
    time_limit_s: float = 120.0,
    solver: pulp.LpSolver | None = None,
) -> PipelineOrder:
    """Makespan-optimal FIFO order for one chunk per rank (see module docstring).

    Uses `planner.milp.mip_solver` (CBC, warm-started, when installed; else HiGHS) unless
    `solver` is given; ScheduleError if no optimum is proven within
    `time_limit_s` (shrink P x M, or use `auto_zero_bubble`).
    """
    import pulp

    from planner.milp import mip_solver

    check_problem(costs, num_microbatches, memory_limit)
    times, pp, m, p2p = stage_times(costs), costs.num_ranks, num_microbatches, costs.p2p_s
    incumbent = auto_zero_bubble(costs, m, memory_limit)
    horizon = simulate(incumbent, costs).step_time_s * (1 + 1e-9) + 1e-9  # slack for rounding
    early, late = _windows(times, m, p2p, horizon)
    prob = pulp.LpProblem("zero_bubble", pulp.LpMinimize)
    start = {
        key: _variable(prob, f"t_{key[0]}_{key[1]}_{key[2]}", early[key], max(early[key], late[key])) for key in early
    }
    makespan = _variable(prob, "makespan", 0.0, horizon)
    prob += makespan

    def end(s: int, k: int, j: int) -> pulp.LpAffineExpression:
        return start[(s, k, j)] + times[s][k]

    binaries: dict[tuple[int, int, int, int, int], pulp.LpVariable] = {}
    for s in range(pp):
        for j in range(m):
            if s > 0:
                prob += start[(s, 0, j)] >= end(s - 1, 0, j) + p2p
            prob += start[(s, 1, j)] >= (end(s + 1, 1, j) + p2p if s < pp - 1 else end(s, 0, j))
            prob += start[(s, 2, j)] >= end(s, 1, j)
            if j > 0:
                for k in range(3):
                    prob += start[(s, k, j)] >= end(s, k, j - 1)
        prob += makespan >= end(s, 2, m - 1)
        prob += makespan >= start[(s, 0, 0)] + m * sum(times[s])
        for j in range(m):
            w_done = []
            for k in range(j):
                for late_kind, early_kind in _PAIRS:
                    a, b = (s, late_kind, j), (s, early_kind, k)
                    # first = 1: a (micro-batch j) runs before b (micro-batch k < j)
                    m_ab = late[a] + times[s][late_kind] - early[b]
                    m_ba = late[b] + times[s][early_kind] - early[a]
                    if m_ba <= 0:
                        first = 0
                    else:
                        first = binaries[(s, late_kind, j, early_kind, k)] = _variable(
                            prob, f"y_{s}_{late_kind}{j}_{early_kind}{k}", 0, 1, pulp.LpBinary
                        )
                        prob += start[b] >= end(*a) - max(m_ab, 0.0) * (1 - first)
                        prob += start[a] >= end(*b) - m_ba * first
                    if (late_kind, early_kind) == (0, 2):
                        w_done.append(1 - first)
            if j + 1 > memory_limit:
                prob += j + 1 - pulp.lpSum(w_done) <= memory_limit

    _warm_start(incumbent, costs, start, binaries, makespan)
    status = prob.solve(solver or mip_solver(time_limit_s, warm_start=True))
    if pulp.LpStatus[status] != "Optimal" or prob.sol_status != pulp.LpSolutionOptimal:
        raise ScheduleError(
            f"the zero-bubble ILP found no proven optimum for P={pp}, M={m} within {time_limit_s:g} s "
            f"(status {pulp.LpStatus[status]}); use auto_zero_bubble for this size"
        )
    kinds = (F, I, W)
    order: PipelineOrder = {}
    for s in range(pp):
        timed = sorted((start[(s, k, j)].value(), k, j) for k in range(3) for j in range(m))
        order[s] = [Action(s, kinds[k], j) for _, k, j in timed]
    return order


def _warm_start(
    incumbent: PipelineOrder,
    costs: StageCosts,
    start: dict[Key, pulp.LpVariable],
    binaries: dict[tuple[int, int, int, int, int], pulp.LpVariable],
    makespan: pulp.LpVariable,
) -> None:
    """Set the MILP's initial values to the heuristic's ASAP schedule."""
    result = simulate(incumbent, costs, timeline=True)
    code = {F: 0, I: 1, W: 2}
    begin = {(e.rank, code[e.action.computation_type], e.action.microbatch_index): e.start_s for e in result.timeline}
    for key, var in start.items():
        var.setInitialValue(min(max(begin[key], var.lowBound), var.upBound))
    for (s, ka, j, kb, k), var in binaries.items():
        var.setInitialValue(1 if begin[(s, ka, j)] < begin[(s, kb, k)] else 0)
    makespan.setInitialValue(result.step_time_s)
