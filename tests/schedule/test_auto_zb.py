"""Automatic zero-bubble scheduling: the heuristic against the exact ILP on small cases.

Stated bounds, P <= 4, M <= 6: the heuristic's makespan is never below the ILP optimum and
at most 5% above it (measured: equal to it on every case below and on 60 random ones); the
greedy alone, without the hill-climb, at most 15% above (measured worst: 10.5%).
"""

from __future__ import annotations

import pytest

from planner.errors import ScheduleError
from planner.schedule import StageCosts, auto_zero_bubble, check_order, generate, optimal_schedule, simulate
from planner.schedule.auto_zb import HeuristicKnobs, heuristic_schedule

HEURISTIC_GAP = 0.05
GREEDY_GAP = 0.15


def _costs(f, i, w, p2p=0.0):
    return StageCosts(
        forward_s=tuple((x,) for x in f),
        backward_input_s=tuple((x,) for x in i),
        backward_weight_s=tuple((x,) for x in w),
        p2p_s=p2p,
    )


UNIFORM = [  # (P, M, F, I, W, p2p, memory limit)
    (2, 4, 1, 1, 1, 0.0, 2),
    (3, 4, 1, 1, 1, 0.0, 3),
    (4, 6, 1, 1, 1, 0.0, 4),
    (4, 6, 1, 1, 1, 0.0, 7),
    (3, 5, 1, 2, 1, 0.2, 3),
    (4, 5, 2, 2, 1, 0.5, 4),
    (3, 6, 1, 1, 1, 0.0, 2),
]

HETEROGENEOUS = [  # (P, M, memory limit, p2p, F per rank, I per rank, W per rank)
    (4, 4, 6, 0.0, (0.5, 2, 1, 0.5), (1, 0.5, 1.5, 2), (0.5, 1.5, 0.25, 0.5)),
    (3, 6, 3, 0.0, (2, 2, 2), (1, 0.5, 1.5), (1.5, 0.5, 0.25)),
    (4, 6, 8, 0.1, (2, 2, 2, 1), (1.5, 2, 0.5, 1.5), (0.25, 1.5, 1, 1.5)),
    (4, 6, 7, 0.1, (2, 2, 1, 2), (1.5, 2, 2, 2), (0.5, 1, 1, 1.5)),
    (4, 4, 2, 0.1, (1.5, 1.5, 1.5, 2), (1.5, 1, 2, 2), (0.5, 0.25, 1, 0.25)),
    (3, 5, 2, 0.5, (1, 0.5, 1.5), (0.5, 0.5, 0.5), (0.25, 1.5, 0.5)),
    (4, 3, 5, 0.0, (2, 1, 0.5, 0.5), (2, 0.5, 1, 1.5), (1, 1.5, 1.5, 0.5)),
    (3, 6, 5, 0.0, (1.5, 1, 1.5), (1.5, 0.5, 1.5), (1, 1, 0.5)),
    (4, 4, 1, 0.5, (2, 1.5, 1.5, 1), (0.5, 0.5, 1.5, 2), (0.25, 0.5, 0.25, 1.5)),
    (4, 5, 6, 0.5, (1.5, 1, 2, 1.5), (1.5, 0.5, 2, 1), (0.5, 0.5, 0.5, 0.25)),
]


def _compare(costs, m, limit):
    heuristic = auto_zero_bubble(costs, m, limit)
    optimum = optimal_schedule(costs, m, limit)
    for order in (heuristic, optimum):
        check_order(order)
        assert max(simulate(order, costs).peak_inflight) <= limit
    return simulate(heuristic, costs).step_time_s, simulate(optimum, costs).step_time_s


@pytest.mark.parametrize(("pp", "m", "f", "i", "w", "p2p", "limit"), UNIFORM)
def test_heuristic_matches_ilp_on_uniform_costs(pp, m, f, i, w, p2p, limit):
    heuristic, optimum = _compare(StageCosts.uniform(pp, 1, f, i, w, p2p), m, limit)
    assert heuristic == pytest.approx(optimum)


@pytest.mark.parametrize(("pp", "m", "limit", "p2p", "f", "i", "w"), HETEROGENEOUS)
def test_heuristic_within_stated_gap_of_ilp(pp, m, limit, p2p, f, i, w):
    costs = _costs(f, i, w, p2p)
    heuristic, optimum = _compare(costs, m, limit)
    assert optimum <= heuristic + 1e-9
    assert heuristic <= optimum * (1 + HEURISTIC_GAP) + 1e-9
    greedy = simulate(auto_zero_bubble(costs, m, limit, max_evaluations=0), costs).step_time_s
    assert optimum <= greedy + 1e-9 <= optimum * (1 + GREEDY_GAP) + 2e-9


def test_with_zb_h1_memory_the_heuristic_is_as_fast_as_zb_h1():
    """Memory limit P (ZB-H1's) and F = I = W: ZB-H1's makespan (P-1)F + 3MF is the lower
    bound (the last rank starts after P-1 forwards, then works 3M units), and the heuristic
    reaches it."""
    pp, m = 4, 12
    costs = StageCosts.uniform(pp, 1, 1.0, 1.0, 1.0)
    ours = simulate(auto_zero_bubble(costs, m, pp), costs)
    assert ours.step_time_s == simulate(generate("zb_h1", pp, m), costs).step_time_s == (pp - 1) + 3 * m


def test_greedy_alone_and_knobs():
    costs = _costs((2, 2, 2), (1, 0.5, 1.5), (1.5, 0.5, 0.25))
    knobs = HeuristicKnobs(extra_warmup_forward=True, fill_short_gaps=True, input_grad_first=False)
    order = heuristic_schedule(costs, 6, 3, knobs)
    check_order(order)
    greedy_only = simulate(auto_zero_bubble(costs, 6, 3, max_evaluations=0), costs).step_time_s
    assert simulate(auto_zero_bubble(costs, 6, 3), costs).step_time_s <= greedy_only


@pytest.mark.parametrize(
    ("costs", "m", "limit", "needle"),
    [
        (StageCosts.uniform(2, 2, 1, 1, 1), 4, 2, "one chunk per rank"),
        (StageCosts.uniform(2, 1, 1, 1, 1), 4, 0, "memory_limit"),
        (StageCosts.uniform(2, 1, 1, 1, 1), 0, 2, "at least one micro-batch"),
    ],
)
def test_bad_problems_are_refused(costs, m, limit, needle):
    with pytest.raises(ScheduleError, match=needle):
        auto_zero_bubble(costs, m, limit)
    with pytest.raises(ScheduleError, match=needle):
        optimal_schedule(costs, m, limit)


def test_never_slower_than_a_hand_crafted_schedule_that_fits():
    """At P = 16 with p2p latency the greedy alone trails ZB-H1; ZB-H1 competes as a
    candidate whenever the memory limit allows it, so the result is at least as fast."""
    pp, m = 16, 32
    costs = StageCosts.uniform(pp, 1, 1.0, 1.0, 1.0, p2p=0.1)
    ours = simulate(auto_zero_bubble(costs, m, pp, max_evaluations=0), costs)
    assert ours.step_time_s <= simulate(generate("zb_h1", pp, m), costs).step_time_s
    assert max(ours.peak_inflight) <= pp
