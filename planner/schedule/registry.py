"""The schedule table: placement, backward split, allowed V, shape rules and torch's names.

One row per schedule name of the DESIGN contract. `TORCH_SCHEDULE_CLASS` maps each name to the
key `torch.distributed.pipelining.schedules.get_schedule_class` accepts (None where torch has
no class; such schedules run in torch from the CSV of `actions.to_csv`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.errors import ScheduleError
from planner.schedule.actions import stage_to_rank


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    """What a schedule needs and how it lays stages out."""

    name: str
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
        ScheduleInfo(name="gpipe", placement="loop", split_backward=False, min_vpp=1, max_vpp=1,
                     torch_name="GPipe", source="Huang et al. 2019, GPipe (fill-drain)"),
        ScheduleInfo(name="1f1b", placement="loop", split_backward=False, min_vpp=1, max_vpp=1,
                     torch_name="1F1B", source="Fan et al. 2021, DAPPLE / PipeDream-flush"),
        ScheduleInfo(name="interleaved_1f1b", placement="loop", split_backward=False, min_vpp=2,
                     max_vpp=None, torch_name="Interleaved1F1B",
                     source="Narayanan et al. 2021, Megatron-LM interleaved schedule"),
        ScheduleInfo(name="looped_bfs", placement="loop", split_backward=False, min_vpp=1,
                     max_vpp=None, torch_name="LoopedBFS",
                     source="Lamy-Poirier 2023, Breadth-First Pipeline Parallelism"),
        ScheduleInfo(name="zb_h1", placement="loop", split_backward=True, min_vpp=1, max_vpp=None,
                     torch_name="InterleavedZeroBubble",
                     source="Qi et al. 2024, Zero Bubble PP, ZB-H1 (V=1); torch's interleaved ZB1P (V>=2)"),
        ScheduleInfo(name="zb_h2", placement="loop", split_backward=True, min_vpp=1, max_vpp=1,
                     torch_name=None, source="Qi et al. 2024, Zero Bubble PP, ZB-H2"),
        ScheduleInfo(name="zbv", placement="v", split_backward=True, min_vpp=2, max_vpp=2,
                     torch_name="ZBVZeroBubble", source="Qi et al. 2024, Zero Bubble PP, ZB-V"),
        ScheduleInfo(name="dualpipev", placement="v", split_backward=True, min_vpp=2, max_vpp=2,
                     torch_name="DualPipeV", source="DeepSeek-AI 2024, DualPipe (V variant)"),
        ScheduleInfo(name="chimera", placement="v", split_backward=False, min_vpp=2, max_vpp=2,
                     torch_name=None, searched_by_default=False,
                     source="Li & Hoefler 2021, Chimera (two 1F1B pipelines in opposite directions)"),
        ScheduleInfo(name="seq1f1b", placement="loop", split_backward=False, min_vpp=1, max_vpp=1,
                     torch_name=None, searched_by_default=False,
                     source="Sun et al. 2024, Seq1F1B (1F1B over sequence segments), arXiv 2406.03488"),
    )
}

TORCH_SCHEDULE_CLASS: dict[str, str | None] = {name: info.torch_name for name, info in SCHEDULES.items()}
"""Our schedule name -> torch `get_schedule_class` key (None: no torch class, use the CSV)."""


SEGMENTED = frozenset({"seq1f1b"})
"""Schedules whose pipelined unit is a sequence segment (they take `segments` k >= 1)."""


def pipeline_starts(name: str, pp: int, vpp: int) -> frozenset[int]:
    """Stages other than 0 where schedule `name` starts a separate pipeline: Chimera's up
    direction begins at stage P (its chunk 1 of rank P-1); none for the others."""
    return frozenset({pp}) if name == "chimera" and vpp == 2 else frozenset()


def schedule_info(name: str) -> ScheduleInfo:
    """The table row of schedule `name` (ScheduleError naming the valid names if unknown)."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ScheduleError(
            f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}"
        ) from None


@lru_cache(maxsize=4096)
def head_rank(name: str, pp: int, vpp: int) -> int:
    """The pipeline rank that runs the last virtual stage (head and loss) of schedule `name`
    (cached: the search asks it for every candidate)."""
    return stage_to_rank(pp * vpp - 1, pp, vpp, schedule_info(name).placement)


def interleave_rounds(pp: int, num_microbatches: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of torch's interleaved schedules.

    torch relaxes Megatron's "M multiple of P": micro-batches go through the chunks in
    rounds = max(1, M // P) groups of M / rounds, which needs M % rounds == 0.
    """
    rounds = max(1, num_microbatches // pp)
    return rounds, num_microbatches // rounds


def check_shape(name: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1) -> ScheduleInfo:
    """Raise ScheduleError unless schedule `name` is defined for (P, M, V) and `segments`
    sequence segments per micro-batch; return its row.

    Rules are torch's where torch implements the schedule: 1F1B needs M >= P, DualPipeV
    M >= 2P, the interleaved schedules M % max(1, M // P) == 0 when V >= 2. Chimera splits
    M evenly between its two directions (M even); only seq1f1b takes segments > 1.
    """
    info = schedule_info(name)
    if segments < 1 or (segments > 1 and name not in SEGMENTED):
        raise ScheduleError(
            f"segments={segments}: only {', '.join(sorted(SEGMENTED))} splits micro-batches into "
            "sequence segments (segments >= 1); other schedules take segments=1"
        )
    if name == "chimera" and pp % 2:
        raise ScheduleError(
            f"chimera needs an even number of stages (as Li & Hoefler 2021: each direction's fill "
            f"is the other's drain only for even depth); got stages={pp}"
        )
    if name == "chimera" and num_microbatches % 2:
        raise ScheduleError(
            f"chimera sends half the micro-batches down and half up, so microbatches must be even; "
            f"got {num_microbatches}, use {num_microbatches + 1}"
        )
    if pp < 1 or num_microbatches < 1 or vpp < 1:
        raise ScheduleError(
            f"pipeline shape must be positive: got stages={pp}, microbatches={num_microbatches}, vpp={vpp}"
        )
    if not info.allows_vpp(vpp):
        raise ScheduleError(
            f"schedule {name} needs vpp {info.vpp_text()} (chunks per rank), got vpp={vpp}"
        )
    if name == "1f1b" and num_microbatches < pp:
        raise ScheduleError(
            f"1f1b needs at least as many micro-batches as stages (as torch's Schedule1F1B): "
            f"got microbatches={num_microbatches} < stages={pp}; use microbatches >= {pp} or gpipe"
        )
    if name == "dualpipev" and num_microbatches < 2 * pp:
        raise ScheduleError(
            f"dualpipev needs at least 2 x stages micro-batches (as torch's ScheduleDualPipeV): "
            f"got microbatches={num_microbatches} < {2 * pp}; use microbatches >= {2 * pp} or zbv"
        )
    if name in ("interleaved_1f1b", "zb_h1") and vpp >= 2:
        rounds, per_round = interleave_rounds(pp, num_microbatches)
        if num_microbatches % rounds:
            good = sorted({per_round * rounds, (per_round + 1) * rounds, pp * rounds})
            raise ScheduleError(
                f"{name} with vpp={vpp} runs micro-batches in max(1, M // stages) = {rounds} equal rounds "
                f"(as torch does), but microbatches={num_microbatches} is not a multiple of {rounds}; "
                f"use e.g. microbatches in {good}"
            )
    return info
