"""Chimera and Seq1F1B: their orders, their papers' bubble formulas against the simulator,
their in-flight counts, Chimera's independent directions and Seq1F1B's causal segments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import ScheduleError
from planner.schedule import StageCosts, check_order, compile_schedule, generate, simulate
from planner.schedule.actions import B, F
from planner.schedule.closed_form import bubble_closed_form, chimera_paper_bubble, inflight_closed_form
from planner.schedule.seq1f1b import causal_segment_scales

even_pp = st.integers(1, 6).map(lambda x: 2 * x)


@settings(max_examples=60, deadline=None)
@given(pp=even_pp, extra=st.integers(0, 12))
def test_chimera_bubble_is_the_papers_for_equal_forward_and_backward(pp, extra):
    m = 2 * pp + 2 * extra
    result = simulate(compile_schedule("chimera", pp, m, 2), StageCosts.uniform(pp, 2, 1.0, 1.0, 0.0))
    assert result.bubble_fraction == pytest.approx(chimera_paper_bubble(pp, m), abs=1e-12)
    # below 1F1B's (D-1)/(N+D-1), and their ratio tends to (D-2)/(2(D-1)) < 1/2 as N grows:
    # the paper's "up to 50 % fewer bubbles"
    one_f_one_b = (pp - 1) / (m + pp - 1)
    assert chimera_paper_bubble(pp, m) < one_f_one_b
    assert chimera_paper_bubble(pp, m) / one_f_one_b <= (pp - 2) / (2 * (pp - 1)) * (1 + (pp - 1) / m)


@settings(max_examples=60, deadline=None)
@given(pp=even_pp, m_half=st.integers(1, 30))
def test_chimera_closed_forms_equal_simulation_with_split_uniform_costs(pp, m_half):
    m = 2 * m_half
    result = simulate(compile_schedule("chimera", pp, m, 2), StageCosts.uniform(pp, 2, 1.0, 1.0, 1.0))
    assert bubble_closed_form("chimera", pp, m, 2) == pytest.approx(result.bubble_fraction, abs=1e-12)
    inflight = inflight_closed_form("chimera", pp, m, 2)
    assert inflight is None or inflight == result.peak_inflight
    assert (inflight is None) == (m < 2 * pp)


def test_chimera_places_two_opposite_pipelines_with_half_the_microbatches_each():
    pp, m = 4, 8
    order = generate("chimera", pp, m, 2)
    info = check_order(order)
    assert info.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)  # down on 0..P-1, up back on P-1..0
    assert info.num_microbatches == m // 2  # numbered per direction
    # the up pipeline's first stage does not wait for the down pipeline's last one
    result = simulate(compile_schedule("chimera", pp, m, 2), StageCosts.uniform(pp, 2, 1.0, 1.0, 0.0), timeline=True)
    start = {e.action: e.start_s for e in result.timeline}
    assert start[(pp, F, 0)] == 0.0 and start[(0, F, 0)] == 0.0
    # the down pipeline's last stage is a last stage: its backward runs before stage P's (a
    # single V pipeline, as ZB-V, would need stage P's backward first)
    assert start[(pp - 1, B, 0)] < start[(pp, B, 0)]


@pytest.mark.parametrize("pp, m", [(3, 6), (4, 7)])
def test_chimera_rejects_odd_stages_or_microbatches(pp, m):
    with pytest.raises(ScheduleError, match="even"):
        generate("chimera", pp, m, 2)


@settings(max_examples=80, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 8), k=st.integers(1, 6))
def test_seq1f1b_bubble_is_the_papers_for_equal_segments(pp, m, k):
    result = simulate(compile_schedule("seq1f1b", pp, m, 1, k), StageCosts.uniform(pp, 1, 1.0, 1.0, 1.0))
    assert result.bubble_fraction == pytest.approx((pp - 1) / (k * m + pp - 1), abs=1e-12)
    assert bubble_closed_form("seq1f1b", pp, m, 1, k) == pytest.approx(result.bubble_fraction, abs=1e-12)
    assert inflight_closed_form("seq1f1b", pp, m, 1, k) == result.peak_inflight


def test_seq1f1b_with_one_segment_is_1f1b_and_orders_segments_causally():
    assert generate("seq1f1b", 4, 6, 1, 1) == generate("1f1b", 4, 6, 1)
    k = 3
    for actions in generate("seq1f1b", 4, 2, 1, k).values():
        forwards = [u for _, kind, u in actions if kind == F]
        backwards = [u for _, kind, u in actions if kind == B]
        assert forwards == sorted(forwards)  # segment j after j-1: it reads their K/V
        assert backwards == [m * k + j for m in range(2) for j in reversed(range(k))]


def test_seq1f1b_holds_fewer_microbatch_activations_than_1f1b():
    pp, m, k = 8, 16, 4
    seq = simulate(compile_schedule("seq1f1b", pp, m, 1, k), StageCosts.uniform(pp, 1, 1, 1, 1)).peak_inflight
    one = simulate(compile_schedule("1f1b", pp, m, 1), StageCosts.uniform(pp, 1, 1, 1, 1)).peak_inflight
    # a segment holds 1/k of a micro-batch: rank 0 holds (P + k - 1)/k against P
    assert [s / k for s in seq] == [(pp - r + k - 1) / k for r in range(pp)]
    assert all(s / k < o for s, o in zip(seq, one) if o > 1)


@pytest.mark.parametrize("k, n", [(2, 64), (4, 64), (8, 32)])
def test_causal_segment_attention_share_matches_a_brute_force_count(k, n):
    """Segment j of s = k n tokens scores the (query, key) pairs with key <= query: counted
    one by one, their share of the whole tends to (2j+1)/k^2 (the half diagonal block adds n/2
    pairs per segment, hence the tolerance)."""
    s = k * n
    total = s * (s + 1) / 2
    for j in range(k):
        pairs = sum(q + 1 for q in range(j * n, (j + 1) * n))
        assert pairs / total == pytest.approx((2 * j + 1) / k**2, abs=1.0 / s)
    scales = causal_segment_scales(k, 1.0)
    assert [x / k for x in scales] == pytest.approx([(2 * j + 1) / k**2 for j in range(k)])
    assert sum(causal_segment_scales(k, 0.4)) == pytest.approx(k)


def test_seq1f1b_causal_costs_keep_the_busy_time_and_move_the_timeline():
    pp, m, k = 4, 4, 4
    compiled = compile_schedule("seq1f1b", pp, m, 1, k)
    flat = StageCosts.uniform(pp, 1, 1.0, 2.0, 0.0)
    causal = StageCosts(
        forward_s=flat.forward_s,
        backward_input_s=flat.backward_input_s,
        backward_weight_s=flat.backward_weight_s,
        unit_scale=causal_segment_scales(k, 0.5) * m,
    )
    even, skewed = simulate(compiled, flat), simulate(compiled, causal, timeline=True)
    assert skewed.busy_s == pytest.approx(even.busy_s)
    # the last segment's forward costs 1 + 0.5 (7/4 - 1) = 1.375 of the mean
    last = next(e for e in skewed.timeline if e.rank == 0 and e.action == (0, F, k - 1))
    assert last.end_s - last.start_s == pytest.approx(1.375)
    assert skewed.step_time_s != pytest.approx(even.step_time_s)
