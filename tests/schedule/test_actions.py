"""Action text form, CSV and stage placement, cross-checked with torch's own parsers."""

from __future__ import annotations

import csv
import io

import pytest

from planner.errors import ScheduleError
from planner.schedule import (
    Action,
    ActionType,
    add_send_recv,
    from_csv,
    generate,
    rank_stages,
    stage_to_rank,
    to_csv,
)
from planner.schedule.actions import SEND_F, B, F, I, W

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
torch_utils = pytest.importorskip("torch.distributed.pipelining._utils")


@pytest.mark.parametrize("text", ["2F0", "0B13", "5I3", "11W7", "1SEND_F4", "3RECV_F0", "2SEND_B9", "0RECV_B1"])
def test_text_form_round_trips_and_matches_torch(text):
    action = Action.from_str(text)
    assert str(action) == text == repr(action)
    theirs = torch_schedules._Action.from_str(text)
    assert (action.stage_index, action.computation_type.value, action.microbatch_index) == (
        theirs.stage_index,
        theirs.computation_type.value,
        theirs.microbatch_index,
    )
    assert str(theirs) == text


def test_fields_and_constants():
    action = Action(2, F, 0)
    assert action == Action.from_str("2F0")
    assert action.is_compute and not Action(1, SEND_F, 3).is_compute
    assert {t.value for t in (F, B, I, W)} == {"F", "B", "I", "W"}
    assert ActionType("I") is I


@pytest.mark.parametrize("bad", ["", "F0", "2X0", "2F-1", "two F zero", "2F0x"])
def test_bad_text_names_the_format(bad):
    with pytest.raises(ScheduleError, match="2F0"):
        Action.from_str(bad)


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp"), [("zb_h2", 3, 6, 1), ("zbv", 2, 4, 2), ("interleaved_1f1b", 2, 4, 2)]
)
def test_csv_round_trips_and_has_torch_layout(name, pp, m, vpp):
    order = generate(name, pp, m, vpp)
    text = to_csv(order)
    assert from_csv(text) == order
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) == pp
    for rank, row in enumerate(rows):
        assert [torch_schedules._Action.from_str(cell) for cell in row] == [
            torch_schedules._Action.from_str(str(a)) for a in order[rank]
        ]


def test_csv_from_torch_dump_reads_back(tmp_path, stage_stub):
    """torch's `_dump_csv` of its interleaved schedule reads back as our generator's order."""
    stages = [stage_stub(s, 8, 4) for s in (0, 4)]
    schedule = torch_schedules.ScheduleInterleaved1F1B(stages, 8)
    path = tmp_path / "torch.csv"
    schedule._dump_csv(str(path), format="compute_only")
    assert from_csv(path.read_text()) == generate("interleaved_1f1b", 4, 8, 2)


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), [("zb_h2", 4, 8, 1), ("gpipe", 2, 3, 1), ("zbv", 2, 4, 2)])
def test_torch_runtime_loads_our_csv(tmp_path, stage_stub, name, pp, m, vpp):
    """torch's `_PipelineScheduleRuntime._load_csv` validates our CSV and lowers it to
    sends/receives (it raises on a malformed or deadlocking compute order)."""
    style = "v" if name == "zbv" else "loop"
    rank0 = torch_utils.generate_rank_to_stage_mapping(pp, pp * vpp, style)[0]
    runtime = torch_schedules.ScheduleLoopedBFS([stage_stub(s, pp * vpp, pp) for s in rank0], m)
    path = tmp_path / "ours.csv"
    path.write_text(to_csv(generate(name, pp, m, vpp)))
    runtime._load_csv(str(path))
    loaded = {r: [str(a) for a in acts if a is not None] for r, acts in runtime.pipeline_order.items()}
    assert loaded == {r: [str(a) for a in acts] for r, acts in generate(name, pp, m, vpp).items()}
    sends = sum(str(a).count("SEND") for acts in runtime.pipeline_order_with_comms.values() for a in acts)
    ours = sum(str(a).count("SEND") for acts in add_send_recv(generate(name, pp, m, vpp)).values() for a in acts)
    assert sends == ours


@pytest.mark.parametrize(
    ("pp", "vpp", "style"), [(4, 1, "loop"), (4, 3, "loop"), (3, 2, "loop"), (4, 2, "v"), (1, 2, "v")]
)
def test_stage_to_rank_matches_torch(pp, vpp, style):
    theirs = torch_utils.generate_stage_to_rank_mapping(pp, pp * vpp, style)
    assert {s: stage_to_rank(s, pp, vpp, style) for s in range(pp * vpp)} == theirs
    for rank in range(pp):
        assert (
            list(rank_stages(rank, pp, vpp, style))
            == torch_utils.generate_rank_to_stage_mapping(pp, pp * vpp, style)[rank]
        )


def test_v_placement_holds_stage_r_and_its_mirror():
    assert rank_stages(1, 4, 2, "v") == (1, 6)
    with pytest.raises(ScheduleError, match="vpp=2"):
        stage_to_rank(0, 4, 3, "v")
    with pytest.raises(ScheduleError, match="outside"):
        stage_to_rank(8, 4, 2, "loop")
    with pytest.raises(ScheduleError, match="placement"):
        stage_to_rank(0, 4, 2, "zigzag")
