"""Generators: hand-checked small orders, placement, counts, and the shape rules."""

from __future__ import annotations

import pytest

from planner.errors import ScheduleError
from planner.schedule import (
    SCHEDULES,
    check_order,
    check_shape,
    format_order,
    generate,
    rank_stages,
    schedule_info,
)

SHAPES = [
    ("gpipe", 4, 6, 1),
    ("1f1b", 4, 6, 1),
    ("interleaved_1f1b", 4, 8, 2),
    ("interleaved_1f1b", 3, 8, 3),
    ("looped_bfs", 3, 5, 2),
    ("zb_h1", 4, 6, 1),
    ("zb_h1", 4, 8, 2),
    ("zb_h2", 4, 9, 1),
    ("zbv", 4, 8, 2),
    ("zbv", 3, 2, 2),
    ("dualpipev", 4, 9, 2),
]


def _text(order):
    return {r: " ".join(map(str, acts)) for r, acts in order.items()}


def test_1f1b_by_hand():
    assert _text(generate("1f1b", 3, 4)) == {
        0: "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        1: "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        2: "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    }


def test_gpipe_and_looped_bfs_by_hand():
    assert _text(generate("gpipe", 2, 2)) == {0: "0F0 0F1 0B0 0B1", 1: "1F0 1F1 1B0 1B1"}
    assert _text(generate("looped_bfs", 2, 2, 2))[0] == "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0"


def test_zb_h1_delays_weight_grads_by_rank():
    """Rank r runs P-1-r warm-up forwards, then F/I pairs, and its W's trail its I's by r."""
    assert _text(generate("zb_h1", 3, 4)) == {
        0: "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        1: "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        2: "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    }


def test_zb_h2_by_hand():
    """Warm-up 2(P-1-r)+1 forwards, (I, W, F) triples, (I, F) pairs, (I, W) pairs, then W's."""
    assert _text(generate("zb_h2", 2, 4)) == {
        0: "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        1: "1F0 1I0 1W0 1F1 1I1 1F2 1I2 1F3 1I3 1W1 1W2 1W3",
    }


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), SHAPES)
def test_every_action_once_on_the_placed_rank(name, pp, m, vpp):
    order = generate(name, pp, m, vpp)
    info = check_order(order)
    assert (info.num_ranks, info.num_stages, info.num_microbatches, info.vpp) == (pp, pp * vpp, m, vpp)
    style = schedule_info(name).placement
    for rank, actions in order.items():
        assert {a.stage_index for a in actions} == set(rank_stages(rank, pp, vpp, style)), format_order(order)
    kinds = {a.computation_type.value for acts in order.values() for a in acts}
    if schedule_info(name).split_backward:
        assert {"I", "W"} <= kinds
    else:
        assert kinds == {"F", "B"}


def test_dualpipev_mixes_full_and_split_backwards():
    kinds = {a.computation_type.value for a in generate("dualpipev", 4, 8, 2)[3]}
    assert kinds == {"F", "B", "I", "W"}


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp", "needle"),
    [
        ("nope", 4, 8, 1, "unknown schedule"),
        ("1f1b", 4, 8, 2, "vpp 1"),
        ("interleaved_1f1b", 4, 8, 1, "vpp >= 2"),
        ("zbv", 4, 8, 3, "vpp 2"),
        ("1f1b", 4, 3, 1, "microbatches >= 4"),
        ("dualpipev", 4, 7, 2, "microbatches >= 8"),
        ("interleaved_1f1b", 4, 9, 2, "multiple of 2"),
        ("gpipe", 0, 8, 1, "positive"),
    ],
)
def test_bad_shapes_name_the_numbers_and_the_fix(name, pp, m, vpp, needle):
    with pytest.raises(ScheduleError, match=needle):
        generate(name, pp, m, vpp)


def test_schedule_table():
    assert list(SCHEDULES) == [
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
        "looped_bfs",
        "zb_h1",
        "zb_h2",
        "zbv",
        "dualpipev",
        "chimera",
        "seq1f1b",
    ]
    zbv = schedule_info("zbv")
    assert (zbv.placement, zbv.split_backward, zbv.allows_vpp(2), zbv.allows_vpp(1)) == ("v", True, True, False)
    assert schedule_info("interleaved_1f1b").allows_vpp(7)
    assert check_shape("zb_h1", 4, 9, 1).torch_name == "InterleavedZeroBubble"
