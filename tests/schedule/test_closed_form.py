"""Closed-form bubbles against the simulator, and against the papers' headline formulas."""

from __future__ import annotations

import pytest

from planner.errors import ScheduleError
from planner.schedule import SCHEDULES, StageCosts, bubble_closed_form, check_shape, compile_schedule, simulate


def _shapes():
    for name, info in SCHEDULES.items():
        for pp in (1, 2, 3, 4, 5, 8):
            for vpp in range(info.min_vpp, (info.max_vpp or 3) + 1):
                for m in range(1, 4 * pp + 2):
                    try:
                        check_shape(name, pp, m, vpp)
                    except ScheduleError:
                        continue
                    yield name, pp, m, vpp


def test_closed_form_equals_simulation_for_uniform_costs():
    checked = 0
    for name, pp, m, vpp in _shapes():
        costs = StageCosts.uniform(pp, vpp, 1.0, 1.0, 1.0)
        simulated = simulate(compile_schedule(name, pp, m, vpp), costs).bubble_fraction
        assert bubble_closed_form(name, pp, m, vpp) == pytest.approx(simulated, abs=1e-12), (name, pp, m, vpp)
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp", "expected"),
    [
        ("gpipe", 4, 8, 1, 3 / 11),
        ("1f1b", 8, 32, 1, 7 / 39),
        ("interleaved_1f1b", 4, 32, 2, 3 / 67),
        ("zb_h1", 4, 8, 1, 3 / 27),
        ("zb_h2", 4, 7, 1, 0.0),
        ("zbv", 4, 7, 2, 0.0),
    ],
)
def test_headline_numbers(name, pp, m, vpp, expected):
    """(P-1)/(M+P-1); (P-1)/(VM+P-1) (the seeds' 70B example: 4.5% at P=4, V=2, M=32);
    ZB-H1 a third of 1F1B's idle; ZB-H2 and ZB-V zero at M = 2P-1."""
    assert bubble_closed_form(name, pp, m, vpp) == pytest.approx(expected)


def test_closed_form_refuses_undefined_shapes():
    with pytest.raises(ScheduleError, match="vpp"):
        bubble_closed_form("1f1b", 4, 8, 2)


def test_inflight_closed_form_matches_the_orders():
    """Wherever a closed form is claimed, it equals the count over the generated order."""
    from planner.schedule import SCHEDULES, generate, peak_held_counts
    from planner.schedule.closed_form import inflight_closed_form
    from planner.schedule.registry import check_shape

    claimed = 0
    for name, info in SCHEDULES.items():
        for pp in range(2, 9):
            for vpp in range(info.min_vpp, min(info.max_vpp or 4, 4) + 1):
                for m in range(1, 4 * pp + 1):
                    try:
                        check_shape(name, pp, m, vpp)
                    except Exception:
                        continue
                    formula = inflight_closed_form(name, pp, m, vpp)
                    if formula is None:
                        continue
                    claimed += 1
                    held = peak_held_counts(generate(name, pp, m, vpp), vpp)
                    assert formula == tuple(max(sum(v) for v in per_rank) for per_rank in held), (name, pp, m, vpp)
    assert claimed > 1000
