"""A parallel layout as the hot path sees it (a frozen slotted dataclass), its checks
against the model and cluster, and conversion from and to the pydantic `PlanEntry`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.errors import LayoutError
from planner.plan import PlanEntry, Predicted
from planner.schedule.registry import schedule_info, virtual_stage
from planner.spec import Cluster, ModelSpec

LayerRange = tuple[int, int]

SHARED_FIELDS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "vpp",
    "mbs",
    "num_microbatches",
    "schedule",
    "sequence_parallel",
    "zero_stage",
    "ep",
    "etp",
    "segments",
)
"""The fields a search `Candidate`, a `Layout` and a plan file's `PlanEntry` hold alike, with the
same meaning: the converters between them copy these and add what each type alone has
(cut points and per-rank recompute; the batch, sequence and prediction)."""


def shared_fields(source: object) -> dict[str, object]:
    """`SHARED_FIELDS` of a Candidate, Layout or PlanEntry, by name."""
    return {name: getattr(source, name) for name in SHARED_FIELDS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Degrees, batching, schedule, recompute and cut points of one training layout."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    vpp: int = 1
    mbs: int
    num_microbatches: int
    schedule: str
    recompute: tuple[str, ...]
    """Recompute mode per pipeline rank."""
    sequence_parallel: bool = False
    zero_stage: int = 1
    stage_layers: tuple[tuple[LayerRange, ...], ...]
    """[rank][chunk] -> half-open range of transformer layers."""
    ep: int = 1
    """Expert-parallel degree; experts fold over the TP x CP x DP ranks as ETP x EP x EDP."""
    etp: int | None = None
    """Expert tensor-parallel degree; None: equal to tp (Megatron's default)."""
    segments: int = 1
    """Sequence segments per micro-batch (seq1f1b's pipelined unit; 1 otherwise)."""

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.vpp

    def chunks(self) -> list[tuple[int, int, int, LayerRange]]:
        """(rank, chunk, virtual stage, layer range) for every chunk, in rank-major order."""
        return [
            (rank, chunk, virtual_stage(rank, chunk, self.pp, self.schedule), layers)
            for rank, per_rank in enumerate(self.stage_layers)
            for chunk, layers in enumerate(per_rank)
        ]


def even_stage_counts(num_layers: int, stages: int) -> list[int]:
    """Layers of each of `stages` contiguous stages in model order, as even as possible; when
    the count does not divide, the extra layers go to the middle stages, since the first
    and last also carry the embedding and the head."""
    base, extra = divmod(num_layers, stages)
    order = sorted(range(stages), key=lambda s: (abs(s - (stages - 1) / 2), s))
    sizes = [base] * stages
    for s in order[:extra]:
        sizes[s] += 1
    return sizes


@lru_cache(maxsize=4096)
def even_stage_layers(num_layers: int, pp: int, vpp: int, schedule: str) -> tuple[tuple[LayerRange, ...], ...]:
    """Cut `num_layers` into pp * vpp contiguous virtual stages as evenly as possible
    (`even_stage_counts`), as [rank][chunk] layer ranges (chimera: the model into pp stages,
    each run by both pipelines)."""
    stages = pp if schedule_info(schedule).bidirectional else pp * vpp
    if num_layers < stages:
        raise LayoutError(
            f"{num_layers} layers cannot fill {pp} pipeline ranks x {vpp} chunks = {stages} "
            "virtual stages; lower --pp or --vpp"
        )
    return stage_layers_from_counts(even_stage_counts(num_layers, stages), num_layers, pp, vpp, schedule)


def stage_layers_from_counts(
    counts: list[int], num_layers: int, pp: int, vpp: int, schedule: str
) -> tuple[tuple[LayerRange, ...], ...]:
    """[rank][chunk] layer ranges from the layer count of each virtual stage in model order
    (chimera: of each of the model's pp stages; rank r runs stage r down and stage pp-1-r up)."""
    if schedule_info(schedule).bidirectional:
        if len(counts) != pp or vpp != 2:
            raise LayoutError(f"chimera cuts the model into pp {pp} stages (vpp 2), got {len(counts)} counts")
        down = stage_layers_from_counts(counts, num_layers, pp, 1, "1f1b")
        return tuple((down[rank][0], down[pp - 1 - rank][0]) for rank in range(pp))
    if len(counts) != pp * vpp:
        raise LayoutError(
            f"{len(counts)} stage layer counts given, but pp {pp} x vpp {vpp} = {pp * vpp} virtual stages"
        )
    if any(c < 0 for c in counts) or sum(counts) != num_layers:
        raise LayoutError(f"stage layer counts {counts} must be >= 0 and add up to the model's {num_layers} layers")
    starts = [sum(counts[:s]) for s in range(len(counts))]
    by_stage = [(starts[s], starts[s] + counts[s]) for s in range(len(counts))]
    return tuple(
        tuple(by_stage[virtual_stage(rank, chunk, pp, schedule)] for chunk in range(vpp)) for rank in range(pp)
    )


def check_layout(layout: Layout, spec: ModelSpec, cluster: Cluster, global_batch: int, seq: int) -> None:
    """Raise LayoutError naming the numbers when the layout cannot exist for this job."""
    if layout.num_gpus != cluster.num_gpus:
        raise LayoutError(
            f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} x cp {layout.cp} = "
            f"{layout.num_gpus} GPUs, but the cluster has {cluster.num_gpus}"
        )
    check_tensor_parallel(spec, layout.tp)
    if layout.dp * layout.mbs * layout.num_microbatches != global_batch:
        raise LayoutError(
            f"global batch {global_batch} != dp {layout.dp} x mbs {layout.mbs} x microbatches {layout.num_microbatches}"
        )
    if seq % (2 * layout.cp if layout.cp > 1 else 1):
        raise LayoutError(f"sequence length {seq} must divide into 2 x cp = {2 * layout.cp} chunks")
    if seq % (layout.segments * (2 * layout.cp if layout.cp > 1 else 1)):
        raise LayoutError(
            f"sequence length {seq} must divide into {layout.segments} segments"
            + (f" of 2 x cp = {2 * layout.cp} chunks" if layout.cp > 1 else "")
        )
    if seq > spec.max_position_embeddings and spec.position_embedding == "learned":
        raise LayoutError(f"sequence length {seq} exceeds the model's {spec.max_position_embeddings} learned positions")
    if len(layout.recompute) != layout.pp:
        raise LayoutError(f"{len(layout.recompute)} recompute modes for {layout.pp} pipeline ranks")
    check_expert_parallel(spec, layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp)


def check_expert_parallel(spec: ModelSpec, tp: int, cp: int, dp: int, ep: int, etp: int) -> None:
    """Raise LayoutError unless EP and ETP fold over the TP x CP x DP ranks (Megatron's MoE
    parallel folding): EP divides the experts, ETP the expert FFN, EP x ETP the ranks."""
    if not spec.is_moe:
        if ep > 1:
            raise LayoutError(f"ep {ep} needs a mixture-of-experts model; {spec.name} is dense")
        return
    if spec.num_experts % ep:
        raise LayoutError(f"ep {ep} does not divide the {spec.num_experts} experts of {spec.name}")
    if spec.expert_ffn_hidden_size % etp:
        raise LayoutError(f"etp {etp} does not divide the expert FFN width {spec.expert_ffn_hidden_size}")
    if (tp * cp * dp) % (ep * etp):
        raise LayoutError(
            f"ep {ep} x etp {etp} does not divide tp {tp} x cp {cp} x dp {dp} = {tp * cp * dp} "
            "ranks the experts fold over"
        )


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Raise LayoutError when `tp` does not divide the heads, the FFN or the KV heads."""
    if spec.num_attention_heads % tp:
        raise LayoutError(f"tp {tp} does not divide the {spec.num_attention_heads} attention heads of {spec.name}")
    if spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        raise LayoutError(f"tp {tp} and the {spec.num_kv_heads} KV heads of {spec.name} must divide one another")
    ffn = spec.ffn_hidden_size if not spec.is_moe or spec.first_dense_layers else spec.expert_ffn_hidden_size
    if ffn % tp:
        raise LayoutError(f"tp {tp} does not divide the FFN width {ffn} of {spec.name}")


def layout_from_entry(entry: PlanEntry) -> Layout:
    """The hot-path Layout of a validated PlanEntry."""
    return Layout(
        **shared_fields(entry),
        recompute=tuple(entry.recompute_of(r) for r in range(entry.pp)),
        stage_layers=tuple(tuple(entry.chunks_of(r)) for r in range(entry.pp)),
    )


def entry_from_layout(
    layout: Layout,
    global_batch: int,
    seq: int,
    predicted: Predicted | None,
    dtype: str = "bf16",
    precision: str = "bf16",
    moe_dispatcher: str = "alltoall",
    moe_ep_overlap: bool = False,
    attention: str | None = None,
) -> PlanEntry:
    """The JSON-contract PlanEntry of a Layout and its prediction (`predict.priced_options`
    gives the last four as the layout was priced)."""
    modes = set(layout.recompute)
    if layout.vpp == 1:
        stage_layers = [list(chunks[0]) for chunks in layout.stage_layers]
    else:
        stage_layers = [[list(r) for r in chunks] for chunks in layout.stage_layers]
    return PlanEntry(
        **shared_fields(layout),
        global_batch=global_batch,
        seq=seq,
        recompute=modes.pop() if len(modes) == 1 else list(layout.recompute),
        dtype=dtype,
        precision=precision,
        moe_dispatcher=moe_dispatcher,
        moe_ep_overlap=moe_ep_overlap,
        attention=attention,
        stage_layers=stage_layers,
        predicted=predicted,
    )
