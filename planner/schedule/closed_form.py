"""Closed-form bubble fractions and in-flight counts for uniform costs, for pruning before
simulating: each schedule's forms (`planner.schedule.formulas`, held by its registry row),
with the simulation or the order's count where a schedule has none at a shape."""

from __future__ import annotations

from planner.schedule.costs import StageCosts
from planner.schedule.registry import check_shape
from planner.schedule.simulate import compile_schedule, simulate


def bubble_closed_form(name: str, pp: int, num_microbatches: int, vpp: int = 1, segments: int = 1) -> float:
    """Bubble fraction of schedule `name` at (P, M, V) with uniform costs.

    Equals `simulate(...).bubble_fraction` for uniform f = i = w and zero communication;
    ScheduleError where the schedule is not defined for (P, M, V).
    """
    info = check_shape(name, pp, num_microbatches, vpp, segments)
    known = info.uniform_bubble(pp, num_microbatches, vpp, segments)
    if known is not None:
        return known
    costs = StageCosts.uniform(pp, vpp, 1.0, 1.0, 1.0)
    return simulate(compile_schedule(name, pp, num_microbatches, vpp), costs).bubble_fraction


def chimera_paper_bubble(pp: int, num_microbatches: int) -> float:
    """Chimera's bubble (D-2)/(2N+D-2) for D = `pp` stages and N micro-batches, with forward
    and backward of equal cost (Li & Hoefler 2021, Table 1); the simulation equals it for
    N >= 2D (see `planner.schedule.formulas`)."""
    return (pp - 2) / (2 * num_microbatches + pp - 2)


def zb_h1_idle_time(pp: int, forward: float, backward_input: float, backward_weight: float) -> float:
    """Per-rank idle time of ZB-H1 (V = 1, M >= P): (P-1)(F + I - W), Qi et al. 2024 section 2.1.

    The paper derives it for F = I = W; it holds whenever W <= min(F, I) (checked by
    simulation in the tests). Compare 1F1B's (P-1)(F + I + W).
    """
    return (pp - 1) * (forward + backward_input - backward_weight)


def inflight_closed_form(
    name: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1
) -> tuple[int, ...] | None:
    """Most micro-batch x chunk activations (segmented: segment x chunk) each rank holds at
    once (F start to the end of its B or W), where a closed form is known; None otherwise
    (then count on the order). Checked against the orders in tests/schedule/test_closed_form.py.
    """
    info = check_shape(name, pp, num_microbatches, vpp, segments)
    return info.inflight(pp, num_microbatches, vpp, segments)
