"""The layout space `planner plan` searches, and the options that restrict it.

A candidate fixes everything but the stage cut points and the per-rank recompute choice:
the mesh GPUs = TP x PP x DP x CP, the micro-batch size and count, the schedule and its
virtual stages, sequence parallelism, the ZeRO stage, and the recompute modes the cut
solver may pick from (all of them when recompute may differ per rank, else exactly one).

Defaults: TP divides the heads (and KV heads, FFN) and stays within a node; CP > 1 only for
sequences of at least `LONG_SEQUENCE` tokens; PP up to the layer count; micro-batch sizes
1, 2, 4, 8; every schedule with V up to `MAX_DEFAULT_VPP`; recompute none / selective /
full, per rank; sequence parallel on and off with TP; ZeRO-1 (distributed optimizer).
A single pipeline rank (PP = 1) has no schedule to choose and is searched as `1f1b`.
Chimera and Seq1F1B are searched when `--schedules` names them (no runtime the exporters
target runs them); Seq1F1B with `DEFAULT_SEGMENTS` sequence segments that split the sequence
(over 2 x CP chunks with context parallelism).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from planner.errors import LayoutError, ScheduleError
from planner.layout import check_expert_parallel, check_tensor_parallel
from planner.plan import RECOMPUTE_MODES
from planner.schedule import SCHEDULES, check_shape, schedule_info
from planner.spec import Cluster, ModelSpec

LONG_SEQUENCE = 16384
"""Sequences this long or longer also try context parallelism by default."""
DEFAULT_MBS = (1, 2, 4, 8)
MAX_DEFAULT_VPP = 8
DEFAULT_SEGMENTS = (2, 4, 8)
"""Seq1F1B's sequence segments per micro-batch (Sun et al. 2024 evaluate k = 2, 4, 8)."""
DEFAULT_SCHEDULES = tuple(name for name, info in SCHEDULES.items() if info.searched_by_default)
"""The schedules `plan` compares when `--schedules` does not name them (not chimera, seq1f1b:
no runtime runs them, so a default plan stays exportable)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Restrictions on each dimension; None leaves the dimension to its default range."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    schedules: tuple[str, ...] | None = None
    segments: tuple[int, ...] | None = None
    """Seq1F1B's sequence segments per micro-batch; default `DEFAULT_SEGMENTS`."""
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    per_rank_recompute: bool = True
    """Let the cut solver give each pipeline rank its own recompute mode."""
    sequence_parallel: tuple[bool, ...] | None = None
    zero: tuple[int, ...] = (1,)
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (MoE); default: 1 and the powers of two dividing the experts."""
    etp: tuple[int, ...] | None = None
    """Expert tensor-parallel degrees (MoE); default: 1 and the candidate's TP."""

    def __post_init__(self) -> None:
        for mode in self.recompute:
            if mode not in RECOMPUTE_MODES:
                raise LayoutError(f"unknown recompute mode '{mode}': choose {', '.join(RECOMPUTE_MODES)}")
        for name in self.schedules or ():
            if name not in SCHEDULES:
                raise ScheduleError(f"unknown schedule '{name}': use one of {', '.join(SCHEDULES)}")
        if any(k < 1 for k in self.segments or ()):
            raise LayoutError(f"sequence segments must be >= 1, got {list(self.segments or ())}")
        if any(z not in (0, 1, 2, 3) for z in self.zero):
            raise LayoutError(f"ZeRO stages are 0..3, got {list(self.zero)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One point of the space: a layout but for its cut points and per-rank recompute."""

    tp: int
    pp: int
    dp: int
    cp: int
    vpp: int
    mbs: int
    num_microbatches: int
    schedule: str
    sequence_parallel: bool
    zero_stage: int
    modes: tuple[str, ...]
    """Recompute modes the cut solver may choose from, per rank."""
    ep: int = 1
    etp: int | None = None
    segments: int = 1
    """Sequence segments per micro-batch (seq1f1b; 1 for the other schedules)."""
    empty_ends: bool = False
    """Cut with the first and last virtual stages holding only the embedding and the head
    (as Llama 3 405B trained), the other layers even; otherwise solver and even cuts."""


def meshes(spec: ModelSpec, cluster: Cluster, seq: int, space: SearchSpace) -> Iterator[tuple[int, int, int, int]]:
    """Every (tp, pp, dp, cp) with tp * pp * dp * cp = GPUs allowed by the space."""
    gpus = cluster.num_gpus
    for tp in space.tp or _divisors(gpus, cluster.gpus_per_node):
        if gpus % tp or not _tp_fits(spec, tp):
            continue
        for cp in space.cp or _default_cp(seq, gpus // tp):
            if (gpus // tp) % cp or (cp > 1 and seq % (2 * cp)):
                continue
            for pp in space.pp or _divisors(gpus // (tp * cp), spec.num_layers):
                if (gpus // (tp * cp)) % pp or pp > spec.num_layers:
                    continue
                yield tp, pp, gpus // (tp * cp * pp), cp


def candidates(
    spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int, space: SearchSpace
) -> Iterator[Candidate]:
    """Every candidate of the space for this job."""
    mode_sets = [space.recompute] if space.per_rank_recompute else [(m,) for m in space.recompute]
    for tp, pp, dp, cp in meshes(spec, cluster, seq, space):
        sp_values = space.sequence_parallel or ((True, False) if tp > 1 else (False,))
        for mbs in space.mbs or DEFAULT_MBS:
            if global_batch % (dp * mbs):
                continue
            m = global_batch // (dp * mbs)
            experts = expert_shapes(spec, tp, cp, dp, space)
            for schedule, vpp, k in schedule_shapes(spec, pp, m, space, seq, cp):
                ends = [
                    e
                    for e in (False, True)
                    if pp * vpp - (2 if e else 0) in range(1, spec.num_layers + 1)
                    and (pp > 1 or not e)
                    and not (e and schedule_info(schedule).bidirectional)
                ]
                for sp in sorted({bool(v) and tp > 1 for v in sp_values}, reverse=True):
                    for zero in space.zero:
                        for modes in mode_sets:
                            for empty_ends in ends:
                                for ep, etp in experts:
                                    yield Candidate(
                                        tp=tp,
                                        pp=pp,
                                        dp=dp,
                                        cp=cp,
                                        vpp=vpp,
                                        mbs=mbs,
                                        num_microbatches=m,
                                        schedule=schedule,
                                        sequence_parallel=sp,
                                        zero_stage=zero,
                                        modes=modes,
                                        empty_ends=empty_ends,
                                        ep=ep,
                                        etp=etp,
                                        segments=k,
                                    )


def expert_shapes(spec: ModelSpec, tp: int, cp: int, dp: int, space: SearchSpace) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs that fold over this mesh's TP x CP x DP ranks; (1, None) for a dense model."""
    if not spec.is_moe:
        return [(1, None)]
    ranks = tp * cp * dp
    eps = space.ep or [e for e in _powers_of_two(spec.num_experts) if e <= ranks]
    etps = space.etp or sorted({1, tp})
    shapes = []
    for etp in etps:
        for ep in eps:
            try:
                check_expert_parallel(spec, tp, cp, dp, ep, etp)
            except LayoutError:
                continue
            shapes.append((ep, etp))
    return shapes


def _powers_of_two(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if n % (1 << i) == 0]


def schedule_shapes(
    spec: ModelSpec, pp: int, num_microbatches: int, space: SearchSpace, seq: int, cp: int = 1
) -> list[tuple[str, int, int]]:
    """(schedule, vpp, segments) defined for this pipeline shape within the space."""
    names = space.schedules or DEFAULT_SCHEDULES
    if pp == 1:
        return [("1f1b", 1, 1)]
    shapes = []
    for name in names:
        info = SCHEDULES[name]
        top = info.max_vpp if info.max_vpp is not None else MAX_DEFAULT_VPP
        stages = pp if schedule_info(name).bidirectional else None  # the model's stages (each run by both directions)
        for vpp in space.vpp or range(info.min_vpp, top + 1):
            if not info.allows_vpp(vpp) or (stages or pp * vpp) > spec.num_layers + 2:  # + embedding, head stages
                continue
            for k in segment_counts(name, seq, cp, space):
                try:
                    check_shape(name, pp, num_microbatches, vpp, k)
                except ScheduleError:
                    continue
                shapes.append((name, vpp, k))
    return shapes


def segment_counts(schedule: str, seq: int, cp: int, space: SearchSpace) -> tuple[int, ...]:
    """Sequence segments to try: for seq1f1b those of the space (default `DEFAULT_SEGMENTS`)
    above 1 (one segment is 1f1b) that split the sequence (into 2 x CP chunks each with
    context parallelism); 1 for the other schedules."""
    if not SCHEDULES[schedule].segmented:
        return (1,)
    chunk = 2 * cp if cp > 1 else 1
    return tuple(k for k in space.segments or DEFAULT_SEGMENTS if k > 1 and seq % (k * chunk) == 0)


def _tp_fits(spec: ModelSpec, tp: int) -> bool:
    try:
        check_tensor_parallel(spec, tp)
    except LayoutError:
        return False
    return True


def _default_cp(seq: int, limit: int) -> list[int]:
    if seq < LONG_SEQUENCE:
        return [1]
    return [c for c in (1, 2, 4, 8, 16, 32) if c <= limit]


def _divisors(n: int, at_most: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(d for d in {*small, *(n // d for d in small)} if d <= at_most)
