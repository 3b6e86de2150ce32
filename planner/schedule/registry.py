"""The schedule table: one record per schedule name of the plan contract (its generator,
placement, backward split, allowed V, how it pipelines, whether a runtime runs it, torch's
name for it, its closed forms and shape rule), the shape check, and `generate`, which picks
the generator by name.

`TORCH_SCHEDULE_CLASS` maps each name to the key `torch.distributed.pipelining.schedules.
get_schedule_class` accepts (None where torch has no class; such schedules run in torch from
the CSV of `actions.to_csv`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from planner.errors import ScheduleError
from planner.schedule import formulas
from planner.schedule.actions import PipelineOrder, stage_to_rank
from planner.schedule.chimera import chimera
from planner.schedule.generators import (
    gpipe,
    interleaved_1f1b,
    looped_bfs,
    one_f_one_b,
    zb_h1,
    zb_h2,
)
from planner.schedule.seq1f1b import seq1f1b
from planner.schedule.v_schedules import dualpipev, zbv

ScheduleGenerator = Callable[[int, int, int, int], PipelineOrder]
"""(P, M, V, segments) -> each rank's compute actions, for a shape `check_shape` accepts."""

BubbleForm = Callable[[int, int, int, int], float | None]
"""(P, M, V, segments) -> bubble fraction under uniform costs, None where no closed form."""

InflightForm = Callable[[int, int, int, int], tuple[int, ...] | None]
"""(P, M, V, segments) -> most activations each rank holds at once, None where no closed form."""

ShapeRule = Callable[[int, int, int], str | None]
"""(P, M, V) -> what the schedule cannot run at this shape (follows its name), None if it can."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    """What a schedule needs, how it lays stages out and pipelines, and how to generate it."""

    name: str
    generator: ScheduleGenerator
    uniform_bubble: BubbleForm
    """Its bubble fraction under uniform costs (`planner.schedule.formulas`)."""
    inflight: InflightForm
    """Its per-rank peak of held activations (`planner.schedule.formulas`)."""
    placement: str
    """"loop" (stage s on rank s % P) or "v" (rank r holds stages r and 2P-1-r)."""
    split_backward: bool
    """True when the backward is (at least partly) split into input-grad I and weight-grad W."""
    min_vpp: int
    max_vpp: int | None
    """Largest allowed number of chunks per rank; None = no upper bound."""
    torch_name: str | None
    """Key for torch's `get_schedule_class`, or None when torch has no such class."""
    source: str
    searched_by_default: bool = True
    """Whether `planner plan` compares it without `--schedules` naming it (every schedule is
    searched when named)."""
    segmented: bool = False
    """Its pipelined unit is a sequence segment: it takes `segments` k >= 1 per micro-batch."""
    bidirectional: bool = False
    """Two pipelines in opposite directions over the same ranks, each holding a replica of the
    model: stage P starts the second one (`pipeline_starts`), and its 2P virtual stages are
    the model's P stages twice (down, then up)."""
    paired: bool = False
    """Runs one micro-batch's forward beside another's backward on the same rank and overlaps
    each one's MoE all-to-all with the other's compute (DeepSeek-V3 report, section 3.2.1:
    DualPipe's computation-communication overlap)."""
    shape_rule: ShapeRule | None = None
    """What it needs of (P, M, V) beyond positive values and an allowed V (torch's rules where
    torch runs it); None: nothing more."""
    simulated_only: str | None = None
    """Why no runtime the planner exports to runs it (`planner plan` searches it and `planner
    simulate` draws it, every exporter refuses it); None: some runtime does."""

    @property
    def v_shaped(self) -> bool:
        """Whether its two chunks per rank sit at stages r and 2P-1-r (a V), not r and r+P."""
        return self.placement == "v"

    def allows_vpp(self, vpp: int) -> bool:
        """Whether `vpp` chunks per rank is defined for this schedule."""
        return vpp >= self.min_vpp and (self.max_vpp is None or vpp <= self.max_vpp)

    def vpp_text(self) -> str:
        """Allowed V as text: '1', '2', '>= 2'."""
        if self.max_vpp == self.min_vpp:
            return str(self.min_vpp)
        return f">= {self.min_vpp}" if self.max_vpp is None else f"{self.min_vpp}..{self.max_vpp}"


SCHEDULES: dict[str, ScheduleInfo] = {
    info.name: info
    for info in (
        ScheduleInfo(
            name="gpipe",
            generator=lambda pp, m, vpp, k: gpipe(pp, m),
            uniform_bubble=formulas.fill_drain_bubble,
            inflight=formulas.gpipe_inflight,
            placement="loop",
            split_backward=False,
            min_vpp=1,
            max_vpp=1,
            torch_name="GPipe",
            source="Huang et al. 2019, GPipe (fill-drain)",
        ),
        ScheduleInfo(
            name="1f1b",
            generator=lambda pp, m, vpp, k: one_f_one_b(pp, m),
            uniform_bubble=formulas.fill_drain_bubble,
            inflight=formulas.one_f_one_b_inflight,
            shape_rule=formulas.one_f_one_b_shape,
            placement="loop",
            split_backward=False,
            min_vpp=1,
            max_vpp=1,
            torch_name="1F1B",
            source="Fan et al. 2021, DAPPLE / PipeDream-flush",
        ),
        ScheduleInfo(
            name="interleaved_1f1b",
            generator=lambda pp, m, vpp, k: interleaved_1f1b(pp, m, vpp),
            uniform_bubble=formulas.looped_bubble,
            inflight=formulas.interleaved_inflight,
            shape_rule=formulas.interleaved_shape,
            placement="loop",
            split_backward=False,
            min_vpp=2,
            max_vpp=None,
            torch_name="Interleaved1F1B",
            source="Narayanan et al. 2021, Megatron-LM interleaved schedule",
        ),
        ScheduleInfo(
            name="looped_bfs",
            generator=lambda pp, m, vpp, k: looped_bfs(pp, m, vpp),
            uniform_bubble=formulas.looped_bubble,
            inflight=formulas.looped_bfs_inflight,
            placement="loop",
            split_backward=False,
            min_vpp=1,
            max_vpp=None,
            torch_name="LoopedBFS",
            source="Lamy-Poirier 2023, Breadth-First Pipeline Parallelism",
        ),
        ScheduleInfo(
            name="zb_h1",
            generator=lambda pp, m, vpp, k: zb_h1(pp, m, vpp),
            uniform_bubble=formulas.zb_h1_bubble,
            inflight=formulas.zb_h1_inflight,
            shape_rule=formulas.interleaved_shape,
            placement="loop",
            split_backward=True,
            min_vpp=1,
            max_vpp=None,
            torch_name="InterleavedZeroBubble",
            source="Qi et al. 2024, Zero Bubble PP, ZB-H1 (V=1); torch's interleaved ZB1P (V>=2)",
        ),
        ScheduleInfo(
            name="zb_h2",
            generator=lambda pp, m, vpp, k: zb_h2(pp, m),
            uniform_bubble=formulas.zb_h2_bubble,
            inflight=formulas.zb_h2_inflight,
            placement="loop",
            split_backward=True,
            min_vpp=1,
            max_vpp=1,
            torch_name=None,
            source="Qi et al. 2024, Zero Bubble PP, ZB-H2",
        ),
        ScheduleInfo(
            name="zbv",
            generator=lambda pp, m, vpp, k: zbv(pp, m),
            uniform_bubble=formulas.zbv_bubble,
            inflight=formulas.zbv_inflight,
            placement="v",
            split_backward=True,
            min_vpp=2,
            max_vpp=2,
            torch_name="ZBVZeroBubble",
            source="Qi et al. 2024, Zero Bubble PP, ZB-V",
        ),
        ScheduleInfo(
            name="dualpipev",
            generator=lambda pp, m, vpp, k: dualpipev(pp, m),
            uniform_bubble=formulas.dualpipev_bubble,
            inflight=formulas.dualpipev_inflight,
            shape_rule=formulas.dualpipev_shape,
            placement="v",
            split_backward=True,
            min_vpp=2,
            max_vpp=2,
            paired=True,
            torch_name="DualPipeV",
            source="DeepSeek-AI 2024, DualPipe (V variant)",
        ),
        ScheduleInfo(
            name="chimera",
            generator=lambda pp, m, vpp, k: chimera(pp, m),
            uniform_bubble=formulas.chimera_bubble,
            inflight=formulas.chimera_inflight,
            shape_rule=formulas.chimera_shape,
            placement="v",
            split_backward=False,
            min_vpp=2,
            max_vpp=2,
            bidirectional=True,
            torch_name=None,
            searched_by_default=False,
            source="Li & Hoefler 2021, Chimera (two 1F1B pipelines in opposite directions)",
            simulated_only="two pipelines in opposite directions, each rank holding two weight "
            "replicas (torch's schedule CSV would chain stage P-1 into stage P as "
            "one V pipeline)",
        ),
        ScheduleInfo(
            name="seq1f1b",
            generator=lambda pp, m, vpp, k: seq1f1b(pp, m, k),
            uniform_bubble=formulas.seq1f1b_bubble,
            inflight=formulas.seq1f1b_inflight,
            placement="loop",
            split_backward=False,
            min_vpp=1,
            max_vpp=1,
            segmented=True,
            torch_name=None,
            searched_by_default=False,
            source="Sun et al. 2024, Seq1F1B (1F1B over sequence segments), arXiv 2406.03488",
            simulated_only="sequence segments as the pipelined unit, attending to earlier "
            "segments' keys and values (torch's schedule CSV would run each "
            "segment as a whole micro-batch)",
        ),
    )
}

TORCH_SCHEDULE_CLASS: dict[str, str | None] = {name: info.torch_name for name, info in SCHEDULES.items()}
"""Our schedule name -> torch `get_schedule_class` key (None: no torch class, use the CSV)."""


def pipeline_starts(name: str, pp: int, vpp: int) -> frozenset[int]:
    """Stages other than 0 where schedule `name` starts a separate pipeline: a bidirectional
    schedule's up direction begins at stage P (its chunk 1 of rank P-1); none for the others."""
    return frozenset({pp}) if schedule_info(name).bidirectional and vpp == 2 else frozenset()


DEFAULT_SEGMENTS = 4
"""Seq1F1B's sequence segments per micro-batch when none is named (`planner evaluate`, `simulate`)."""


def default_segments(name: str) -> int:
    """The sequence segments per micro-batch schedule `name` runs when none is named."""
    return DEFAULT_SEGMENTS if schedule_info(name).segmented else 1


def schedule_info(name: str) -> ScheduleInfo:
    """The table row of schedule `name` (ScheduleError naming the valid names if unknown)."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}") from None


@lru_cache(maxsize=4096)
def head_rank(name: str, pp: int, vpp: int) -> int:
    """The pipeline rank that runs the last virtual stage (head and loss) of schedule `name`
    (cached: the search asks it for every candidate)."""
    return stage_to_rank(pp * vpp - 1, pp, vpp, schedule_info(name).placement)


def check_shape(name: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1) -> ScheduleInfo:
    """Raise ScheduleError unless schedule `name` is defined for (P, M, V) and `segments`
    sequence segments per micro-batch; return its row.

    Beyond positive values and an allowed V, each schedule's `shape_rule` (torch's where torch
    implements the schedule); only a segmented schedule takes segments > 1.
    """
    info = schedule_info(name)
    if segments < 1 or (segments > 1 and not info.segmented):
        segmented = sorted(other for other, row in SCHEDULES.items() if row.segmented)
        raise ScheduleError(
            f"segments={segments}: only {', '.join(segmented)} splits micro-batches into "
            "sequence segments (segments >= 1); other schedules take segments=1"
        )
    if pp < 1 or num_microbatches < 1 or vpp < 1:
        raise ScheduleError(
            f"pipeline shape must be positive: got stages={pp}, microbatches={num_microbatches}, vpp={vpp}"
        )
    if not info.allows_vpp(vpp):
        raise ScheduleError(f"schedule {name} needs vpp {info.vpp_text()} (chunks per rank), got vpp={vpp}")
    problem = info.shape_rule(pp, num_microbatches, vpp) if info.shape_rule else None
    if problem:
        raise ScheduleError(f"{name} {problem}")
    return info


def generate(name: str, pp: int, num_microbatches: int, vpp: int = 1, segments: int = 1) -> PipelineOrder:
    """Per-rank compute actions of schedule `name` for P=`pp`, M, V=`vpp` (checked first);
    a segmented schedule cuts each micro-batch into `segments` units (micro-batch index m*k + j).

    Raises ScheduleError for an unknown name or a shape the schedule does not define.
    """
    return check_shape(name, pp, num_microbatches, vpp, segments).generator(pp, num_microbatches, vpp, segments)


def virtual_stage(rank: int, chunk: int, pp: int, schedule: str) -> int:
    """The model-order index of chunk `chunk` on pipeline rank `rank`: chunk * pp + rank for
    looped placement, and 2 * pp - 1 - rank for the second chunk of a V-shaped schedule."""
    if chunk == 1 and schedule_info(schedule).v_shaped:
        return 2 * pp - 1 - rank
    return chunk * pp + rank
