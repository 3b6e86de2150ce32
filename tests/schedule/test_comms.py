"""Send/receive lowering: placement of each transfer and the checker's complaints."""

from __future__ import annotations

import pytest

from planner.errors import ScheduleError
from planner.schedule import Action, add_send_recv, check_send_recv, compute_only, generate


def test_lowering_by_hand():
    lowered = add_send_recv(generate("1f1b", 2, 2))
    assert [str(a) for a in lowered[0]] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"]
    assert [str(a) for a in lowered[1]] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]
    assert compute_only(lowered) == generate("1f1b", 2, 2)
    check_send_recv(lowered)


def test_v_turn_needs_no_transfer():
    """Stages P-1 and P of a V placement share the last rank: nothing is sent between them."""
    lowered = add_send_recv(generate("zbv", 2, 2, 2))
    assert Action.from_str("1SEND_F0") not in lowered[1] and Action.from_str("2RECV_F0") not in lowered[1]
    assert Action.from_str("0SEND_F0") in lowered[0] and Action.from_str("1RECV_F0") in lowered[1]
    check_send_recv(lowered)


@pytest.mark.parametrize(("drop", "needle"), [("1RECV_F0", "needs 1RECV_F0"), ("0SEND_F1", "needs 0SEND_F1")])
def test_missing_transfer_is_reported(drop, needle):
    lowered = add_send_recv(generate("gpipe", 2, 2))
    broken = {r: [a for a in acts if str(a) != drop] for r, acts in lowered.items()}
    with pytest.raises(ScheduleError, match=needle):
        check_send_recv(broken)


def test_receive_after_its_consumer_is_reported():
    lowered = add_send_recv(generate("gpipe", 2, 2))
    rank1 = lowered[1]
    i = rank1.index(Action.from_str("1RECV_F0"))
    rank1[i], rank1[i + 1] = rank1[i + 1], rank1[i]
    with pytest.raises(ScheduleError, match="before 1F0"):
        check_send_recv(lowered)
