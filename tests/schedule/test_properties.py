"""Properties of every schedule over random shapes and random per-stage costs (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.errors import ScheduleError
from planner.schedule import (
    SCHEDULES,
    StageCosts,
    add_send_recv,
    check_send_recv,
    check_shape,
    generate,
    rank_stages,
    schedule_info,
    simulate,
    stage_to_rank,
)

from .conftest import reference_times

SETTINGS = settings(max_examples=100, deadline=None)
cost_value = st.floats(min_value=0.05, max_value=3.0, allow_nan=False).map(lambda x: round(x, 2))


@st.composite
def cases(draw):
    """A schedule, a shape it accepts, and random per-(rank, chunk) costs."""
    # one pipeline of M micro-batches per stage; chimera's two (M/2 each) are checked in
    # test_chimera_seq1f1b.py
    name = draw(st.sampled_from([n for n in SCHEDULES if n != "chimera"]))
    info = schedule_info(name)
    pp = draw(st.integers(1, 5))
    vpp = draw(st.integers(info.min_vpp, info.max_vpp or 3))
    m = draw(st.integers(1, 10))
    try:
        check_shape(name, pp, m, vpp)
    except ScheduleError:
        assume(False)

    def table():
        return tuple(tuple(draw(cost_value) for _ in range(vpp)) for _ in range(pp))

    costs = StageCosts(
        forward_s=table(),
        backward_input_s=table(),
        backward_weight_s=table(),
        p2p_s=draw(st.sampled_from([0.0, 0.0, 0.1, 0.7])),
        slowdown=draw(st.none() | st.tuples(*[st.sampled_from([1.0, 1.25, 2.0])] * pp)),
    )
    return name, pp, m, vpp, costs


def _duration(costs, rank, chunk, kind):
    factor = costs.slowdown[rank] if costs.slowdown else 1.0
    f, i, w = (t[rank][chunk] for t in (costs.forward_s, costs.backward_input_s, costs.backward_weight_s))
    return factor * {"F": f, "I": i, "W": w, "B": i + w}[kind]


@SETTINGS
@given(cases())
def test_schedules_are_valid_and_respect_dependencies(case):
    name, pp, m, vpp, costs = case
    order = generate(name, pp, m, vpp)
    style = schedule_info(name).placement
    per_stage = 3 if schedule_info(name).split_backward and name != "dualpipev" else None
    seen = {}
    for rank, actions in order.items():
        for a in actions:
            assert a.stage_index in rank_stages(rank, pp, vpp, style)
            key = (a.stage_index, a.computation_type.value, a.microbatch_index)
            assert key not in seen
            seen[key] = a
    for stage in range(pp * vpp):
        for mb in range(m):
            kinds = {k for (s, k, j) in seen if (s, j) == (stage, mb)}
            assert kinds in ({"F", "B"}, {"F", "I", "W"})
    if per_stage:
        assert len(seen) == per_stage * pp * vpp * m

    result = simulate(order, costs, timeline=True)
    times = {e.action: (e.start_s, e.end_s) for e in result.timeline}
    eps = 1e-9
    for actions in order.values():
        spans = [times[a] for a in actions]
        assert all(end0 <= start1 + eps for (_, end0), (start1, _) in zip(spans, spans[1:])), "overlap on a rank"
    rank_of = {a.stage_index: r for r, acts in order.items() for a in acts}
    backward = {(a.stage_index, a.microbatch_index): a for a in seen.values() if a.computation_type.value in "BI"}
    for a in seen.values():
        s, kind, mb = a.stage_index, a.computation_type.value, a.microbatch_index
        start = times[a][0]
        if kind == "F" and s > 0:
            src = seen[(s - 1, "F", mb)]
        elif kind in "BI" and s < pp * vpp - 1:
            src = backward[(s + 1, mb)]
        elif kind in "BI":
            src = seen[(s, "F", mb)]
        else:
            src = backward[(s, mb)] if kind == "W" else None
        if src is not None:
            lag = costs.p2p_s if rank_of[src.stage_index] != rank_of[s] else 0.0
            assert start + eps >= times[src][1] + lag
        if kind in "BI":
            assert times[seen[(s, "F", mb)]][1] <= start + eps, "backward before its forward"


@SETTINGS
@given(cases())
def test_makespan_bounds_and_reference(case):
    """Makespan >= one micro-batch's critical path and >= the busiest rank's work, and
    equals the independent DAG evaluation."""
    name, pp, m, vpp, costs = case
    order = generate(name, pp, m, vpp)
    result = simulate(order, costs)
    style = schedule_info(name).placement
    chunk_of = {}
    for r in range(pp):
        for c, s in enumerate(rank_stages(r, pp, vpp, style)):
            chunk_of[s] = (r, c)
    kinds = {
        (a.stage_index, a.microbatch_index): a.computation_type.value
        for acts in order.values()
        for a in acts
        if a.computation_type.value in "BI"
    }
    num_stages = pp * vpp
    for mb in range(m):
        path = 0.0
        for s in range(num_stages):
            path += _duration(costs, *chunk_of[s], "F") + _duration(costs, *chunk_of[s], kinds[(s, mb)])
            if s and chunk_of[s][0] != chunk_of[s - 1][0]:
                path += 2 * costs.p2p_s
        if kinds[(0, mb)] == "I":
            path += _duration(costs, *chunk_of[0], "W")
        assert result.step_time_s >= path - 1e-9
    work = [
        sum(_duration(costs, *chunk_of[a.stage_index], a.computation_type.value) for a in order[r]) for r in range(pp)
    ]
    assert max(work) <= result.step_time_s + 1e-9
    assert result.busy_s == pytest.approx(work, rel=1e-9, abs=1e-9)
    reference = max(end for _, end in reference_times(order, costs).values())
    assert result.step_time_s == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert 0.0 <= result.bubble_fraction < 1.0
    assert all(i <= w <= m * vpp for i, w in zip(result.peak_inflight_freed_at_input_grad, result.peak_inflight))


@SETTINGS
@given(cases())
def test_send_recv_lowering_is_consistent(case):
    name, pp, m, vpp, _ = case
    lowered = add_send_recv(generate(name, pp, m, vpp))
    check_send_recv(lowered)
    sends = sum(1 for acts in lowered.values() for a in acts if a.computation_type.value.startswith("SEND"))
    style = schedule_info(name).placement
    boundaries = sum(
        1 for s in range(pp * vpp - 1) if stage_to_rank(s, pp, vpp, style) != stage_to_rank(s + 1, pp, vpp, style)
    )
    assert sends == 2 * m * boundaries
