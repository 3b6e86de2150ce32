"""The simulator predicts real torch.distributed.pipelining step times on 2 CPU processes.

One launch of 2 gloo processes profiles and runs GPipe, 1F1B, interleaved 1F1B (V=2) and ZB-V
(planner/fidelity/pipelined.py). The test asserts what does not depend on the machine's
speed: every schedule runs, and the predicted peak of saved bytes per rank matches the
measured one. The step times are printed, not asserted (a shared CI machine moves them by
30%): `python tests/bench/pipelined_cpu.py` compares them, docs/accuracy_pipelined.md has
the figures. Pure parts are checked without processes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed.pipelining")

from planner.fidelity.pipelined import (  # noqa: E402
    DEFAULT_CASES,
    CaseMeasurement,
    ChunkProfile,
    compare,
    format_table,
    measure,
    stage_costs,
    stage_layer_ranges,
)


def test_stage_layer_ranges_split_evenly():
    assert stage_layer_ranges(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_layer_ranges(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError):
        stage_layer_ranges(2, 4)


def _measurement(schedule: str, vpp: int) -> CaseMeasurement:
    chunk = ChunkProfile(
        stage=0,
        forward_s=1.0,
        input_s=1.0,
        weight_s=0.5,
        backward_s=1.75,
        activation_bytes=10,
        weight_grad_bytes=4,
        retained_bytes=0,
    )
    return CaseMeasurement(
        schedule=schedule,
        pp=2,
        vpp=vpp,
        num_microbatches=4,
        chunks=((chunk,) * vpp,) * 2,
        p2p_s=0.0,
        step_s=(1.0,),
        peak_saved_bytes=(0, 0),
    )


def test_full_backward_schedules_use_the_measured_full_backward():
    costs = stage_costs(_measurement("1f1b", 1))
    assert costs.backward_input_s == ((1.75,), (1.75,)) and costs.backward_weight_s == ((0.0,), (0.0,))
    split = stage_costs(_measurement("zbv", 2))
    assert split.backward_input_s[0] == (1.0, 1.0) and split.backward_weight_s[0] == (0.5, 0.5)


def test_1f1b_prediction_is_the_closed_form():
    row = compare(_measurement("1f1b", 1))
    # (M + P - 1) x (F + B) with F = 1, B = 1.75
    assert row.predicted_s == pytest.approx((4 + 2 - 1) * 2.75)
    assert "1f1b" in format_table([row])


@pytest.mark.slow
def test_two_process_schedules_run_and_hold_the_predicted_memory():
    rows = [compare(m) for m in measure(2, cases=DEFAULT_CASES)]
    print("\n" + format_table(rows))  # step times: reported, not asserted
    assert [r.schedule for r in rows] == [c.schedule for c in DEFAULT_CASES]
    for row in rows:
        assert row.predicted_s > 0 and row.measured_s > 0
        # saved bytes held F to I, I to W, and (split backward) W to the step's end
        for predicted, measured in zip(row.predicted_peak_bytes, row.measured_peak_bytes):
            assert predicted == pytest.approx(measured, rel=0.02)
