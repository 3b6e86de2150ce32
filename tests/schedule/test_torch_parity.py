"""Our per-rank compute orders equal what torch.distributed.pipelining executes.

No process group: multi-stage schedules are built on stand-in stage objects and their
`pipeline_order` read (idle `None`s dropped, OVERLAP_F_B expanded into its sub-actions);
GPipe and 1F1B are single-stage schedules whose order is recorded by running their own
`_step_microbatches` against a stage that logs forward/backward calls (torch's
`Schedule1F1B._get_pipeline_order` is not what it executes: it skips F0 on the last rank).
"""

from __future__ import annotations

import pytest

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
torch_utils = pytest.importorskip("torch.distributed.pipelining._utils")

from planner.errors import ScheduleError  # noqa: E402
from planner.schedule import TORCH_SCHEDULE_CLASS, generate, schedule_info  # noqa: E402

from .conftest import StageStub  # noqa: E402


class _RecordingStage(StageStub):
    """A single stage that logs the compute torch's `_step_microbatches` asks of it."""

    def __init__(self, stage_index: int, num_stages: int):
        super().__init__(stage_index, num_stages, num_stages)
        self.is_last = stage_index == num_stages - 1
        self.log: list[str] = []

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}B{mb}")

    def get_fwd_recv_ops(self, mb):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, *args, **kwargs):
        pass


def _torch_class(name: str):
    return schedules.get_schedule_class(TORCH_SCHEDULE_CLASS[name])


def _torch_single_stage_order(name: str, pp: int, m: int) -> dict[int, list[str]]:
    order = {}
    for rank in range(pp):
        stage = _RecordingStage(rank, pp)
        schedule = _torch_class(name)(stage, m)
        schedule._initialize_stage = lambda *args, **kwargs: None
        schedule._step_microbatches()
        order[rank] = stage.log
    return order


def _torch_multi_stage_order(name: str, pp: int, m: int, vpp: int) -> dict[int, list[str]]:
    style = schedule_info(name).placement
    rank0_stages = torch_utils.generate_rank_to_stage_mapping(pp, pp * vpp, style)[0]
    schedule = _torch_class(name)([StageStub(s, pp * vpp, pp) for s in rank0_stages], m)
    order = {}
    for rank, actions in schedule.pipeline_order.items():
        steps = []
        for action in actions:
            if action is None:
                continue
            steps += [str(a) for a in (action.sub_actions or (action,))]
        order[rank] = steps
    return order


def _ours(name: str, pp: int, m: int, vpp: int) -> dict[int, list[str]]:
    return {r: [str(a) for a in acts] for r, acts in generate(name, pp, m, vpp).items()}


SINGLE = [("gpipe", pp, m) for pp, m in [(1, 3), (2, 1), (2, 5), (4, 3), (4, 8), (5, 7)]] + [
    ("1f1b", pp, m) for pp, m in [(1, 2), (2, 2), (3, 7), (4, 4), (4, 6), (4, 9), (8, 8), (8, 13)]
]

MULTI = (
    [
        ("interleaved_1f1b", pp, m, v)
        for pp, m, v in [
            (2, 4, 2),
            (4, 8, 2),
            (4, 16, 2),
            (4, 3, 2),
            (4, 6, 2),
            (4, 7, 2),
            (4, 10, 2),
            (4, 12, 3),
            (3, 5, 2),
            (8, 16, 4),
            (8, 12, 2),
            (1, 3, 2),
        ]
    ]
    + [("looped_bfs", pp, m, v) for pp, m, v in [(2, 3, 1), (4, 8, 2), (4, 5, 3), (3, 7, 2)]]
    + [
        ("zb_h1", pp, m, v)
        for pp, m, v in [
            (2, 4, 1),
            (4, 8, 1),
            (4, 3, 1),
            (4, 10, 1),
            (8, 16, 1),
            (4, 8, 2),
            (4, 10, 2),
            (4, 6, 2),
            (4, 3, 2),
            (3, 9, 3),
            (8, 24, 2),
        ]
    ]
    + [("zbv", pp, m, 2) for pp, m in [(1, 2), (2, 4), (4, 2), (4, 5), (4, 7), (4, 8), (4, 11), (8, 16), (8, 20)]]
    + [("dualpipev", pp, m, 2) for pp, m in [(1, 2), (2, 4), (2, 7), (4, 8), (4, 11), (3, 9), (8, 16), (8, 21)]]
)


@pytest.mark.parametrize(("name", "pp", "m"), SINGLE)
def test_single_stage_schedules_match_torch_execution(name, pp, m):
    assert _ours(name, pp, m, 1) == _torch_single_stage_order(name, pp, m)


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), MULTI)
def test_multi_stage_schedules_match_torch_pipeline_order(name, pp, m, vpp):
    assert _ours(name, pp, m, vpp) == _torch_multi_stage_order(name, pp, m, vpp)


@pytest.mark.parametrize(
    ("name", "pp", "m", "vpp"),
    [
        ("1f1b", 4, 3, 1),
        ("dualpipev", 4, 7, 2),
        ("interleaved_1f1b", 4, 9, 2),
        ("zb_h1", 4, 9, 2),
    ],
)
def test_shapes_torch_refuses_are_refused(name, pp, m, vpp):
    with pytest.raises(ScheduleError):
        generate(name, pp, m, vpp)
    with pytest.raises((ValueError, RuntimeError)):
        if vpp == 1:
            _torch_single_stage_order(name, pp, m)
        else:
            _torch_multi_stage_order(name, pp, m, vpp)


def test_zb_h1_at_one_chunk_accepts_any_microbatch_count():
    """torch's round rule (M % max(1, M // P) == 0) only matters when V >= 2: at V = 1 the
    order does not depend on the rounds, so we accept M = 9 with P = 4 where torch refuses,
    and match torch wherever it accepts."""
    order = generate("zb_h1", 4, 9, 1)
    assert sum(len(a) for a in order.values()) == 3 * 4 * 9
    with pytest.raises(ValueError):
        _torch_multi_stage_order("zb_h1", 4, 9, 1)


def test_every_torch_name_is_a_torch_schedule_class():
    for name, key in TORCH_SCHEDULE_CLASS.items():
        if key is None:
            assert name in ("zb_h2", "chimera", "seq1f1b")
            continue
        assert schedules.get_schedule_class(key).__name__.lower().endswith(key.lower())


def test_sweep_of_small_shapes():
    """Every (P <= 5, M <= 10, V) for the multi-stage schedules: where torch builds the
    schedule our order is the same, and where torch refuses the shape so do we (except
    zb_h1 at V = 1, see above)."""
    compared = 0
    for name, vpps in (
        ("interleaved_1f1b", (2, 3)),
        ("looped_bfs", (1, 2)),
        ("zb_h1", (1, 2, 3)),
        ("zbv", (2,)),
        ("dualpipev", (2,)),
    ):
        for pp in range(1, 6):
            for m in range(1, 11):
                for vpp in vpps:
                    try:
                        theirs = _torch_multi_stage_order(name, pp, m, vpp)
                    except (ValueError, RuntimeError):
                        if not (name == "zb_h1" and vpp == 1):
                            with pytest.raises(ScheduleError):
                                generate(name, pp, m, vpp)
                        continue
                    assert _ours(name, pp, m, vpp) == theirs, (name, pp, m, vpp)
                    compared += 1
    assert compared >= 390
