"""The plan: one training layout and what the planner predicts for it.

This is the JSON contract of `planner plan --json`, `planner evaluate --json` and the
`-o plan.json` file the exporters read (docs/architecture.md, "The plan file"). Field names and meanings are fixed;
new fields may be added, none removed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import ConfigError
from planner.request import Request
from planner.schedule.registry import schedule_info, virtual_stage
from planner.spec import ModelSpec, validation_message

ScheduleName = Literal[
    "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb_h1", "zb_h2", "zbv", "dualpipev", "chimera", "seq1f1b"
]
"""The contract's schedule names: those of planner/schedule/registry.py's table."""
RecomputeName = Literal["none", "selective", "full"]
LayerKindName = Literal["embedding", "transformer", "head"]
CostSourceName = Literal["measured", "calibrated", "analytic"]

RECOMPUTE_MODES: tuple[str, ...] = RecomputeName.__args__  # type: ignore[attr-defined]

FROZEN = ConfigDict(frozen=True, extra="forbid")
LayerRange = tuple[int, int]


class MemoryBreakdown(BaseModel):
    """Memory of the most loaded GPU, GiB."""

    model_config = FROZEN

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float
    """CUDA context, NCCL buffers, cuBLAS workspace and the caching allocator's fragmentation."""


class Predicted(BaseModel):
    """What the cost model predicts for one training step of the layout."""

    model_config = FROZEN

    step_time_s: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs (no recompute) per second per GPU over the dense bf16 peak."""
    bubble_fraction: float
    """The pipeline bubble: the pipeline ranks' mean idle share of the longest rank's span,
    from its first action's start to its last action's end (Qi et al. 2024's measure;
    (P-1)/(M+P-1) for 1F1B with uniform costs). Every table's `bubble` is this."""
    memory_gb_per_stage: list[float]
    """Peak device memory per pipeline rank, GiB: the caching allocator's reserved memory plus
    the CUDA context and NCCL buffers outside it (what must fit in the GPU)."""
    memory_breakdown_gb: MemoryBreakdown
    time_breakdown_s: dict[str, float] = Field(default_factory=dict)
    """Where the step goes on the rank that finishes last: compute, exposed TP / PP / DP
    communication, its idle time until its last action (`pipeline_bubble`, shown as
    "pipeline idle": seconds of that one rank, not `bubble_fraction`), the tied embedding's
    gradient all-reduce, fp16's loss-scale check, the gradient norm, optimizer."""
    memory_reserved_gb_per_stage: list[float] = Field(default_factory=list)
    """Peak reserved memory of the caching allocator per pipeline rank (what
    torch.cuda.max_memory_reserved reports), GiB."""
    memory_allocated_gb_per_stage: list[float] = Field(default_factory=list)
    """Peak memory of the tensors per pipeline rank (torch.cuda.max_memory_allocated), GiB."""
    step_time_interval_s: list[float] = Field(default_factory=list)
    """[low, high]: the step time runs like this one measured, from the step errors of comparable
    published runs, or of the calibration's own runs (planner/uncertainty.py)."""
    interval_basis: str = ""
    """The runs the interval rests on."""


TIME_PART_NAMES = {
    "pipeline_bubble": "pipeline idle",
    "tp_cp_comm": "TP/CP comm",
    "moe_all_to_all": "MoE all-to-all",
    "pp_p2p_blocked": "PP send/recv blocked",
    "dp_comm_exposed": "DP comm exposed",
}
"""How the tables and the report name a `time_breakdown_s` key (others: its words)."""


def time_part_name(key: str) -> str:
    """The name people read for a `time_breakdown_s` key."""
    return TIME_PART_NAMES.get(key, key.replace("_", " "))


class PlanEntry(BaseModel):
    """One layout (the JSON contract's `plans[i]`)."""

    model_config = FROZEN

    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    dp: int = Field(gt=0)
    cp: int = Field(default=1, gt=0)
    vpp: int = Field(default=1, gt=0)
    mbs: int = Field(gt=0)
    num_microbatches: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    seq: int = Field(gt=0)
    schedule: ScheduleName
    recompute: RecomputeName | list[RecomputeName] = "none"
    """One mode for every stage, or one per pipeline rank."""
    sequence_parallel: bool = False
    zero_stage: int = Field(default=1, ge=0, le=3)
    dtype: str = "bf16"
    stage_layers: list[LayerRange] | list[list[LayerRange]]
    """Per pipeline rank, the half-open range of transformer layers it runs; with vpp > 1 a
    list of ranges per rank, one per chunk in chunk order."""
    predicted: Predicted | None = None
    cost_sources: dict[LayerKindName, CostSourceName] = Field(default_factory=dict)
    """Per layer kind, where its compute times came from: "measured" (the profile spans the
    shape), "calibrated" (the analytic model fitted to the profile), "analytic" (the GPU
    preset's efficiencies)."""
    ep: int = Field(default=1, gt=0)
    """Expert-parallel degree (MoE): the experts fold over TP x CP x DP as ETP x EP x EDP."""
    etp: int | None = Field(default=None, gt=0)
    """Expert tensor-parallel degree (MoE); None: equal to tp, Megatron's default."""
    precision: Literal["bf16", "fp8"] = "bf16"
    """GEMM precision of the linear layers (planner/cost/model.py CostOptions.precision)."""
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    """MoE token dispatcher the plan was priced with (CostOptions.moe_dispatcher): "deepep" only
    where DeepEP's kernels were costed (an MoE model with ep > 1); exporters write it or refuse."""
    moe_ep_overlap: bool = False
    """Whether the plan was priced with Megatron's combined-1F1B all-to-all overlap
    (CostOptions.moe_ep_overlap, where `predict.runs_combined_1f1b` says Megatron runs it)."""
    attention: str | None = None
    """The attention kernel the plan was priced with (CostOptions.attention); exporters refuse a
    kernel their runtime does not run. None in plan files written before this field."""
    runtimes: list[str] | None = None
    """The runtimes whose exporter takes this plan as it is (`planner export --to NAME`), in
    the exporters' order; None where not worked out (plan files written before this field)."""
    segments: int = Field(default=1, gt=0)
    """Sequence segments per micro-batch, the pipelined unit of seq1f1b (1 for every other
    schedule)."""

    @model_validator(mode="after")
    def _check(self) -> PlanEntry:
        if self.dp * self.mbs * self.num_microbatches != self.global_batch:
            raise ValueError(
                f"global_batch {self.global_batch} != dp {self.dp} x mbs {self.mbs} x "
                f"num_microbatches {self.num_microbatches}"
            )
        if len(self.stage_layers) != self.pp:
            raise ValueError(f"stage_layers has {len(self.stage_layers)} ranks, pp is {self.pp}")
        if isinstance(self.recompute, list) and len(self.recompute) != self.pp:
            raise ValueError(f"recompute lists {len(self.recompute)} ranks, pp is {self.pp}")
        schedule = schedule_info(self.schedule)
        if self.segments > 1 and not schedule.segmented:
            raise ValueError(f"segments {self.segments}: only seq1f1b splits micro-batches into sequence segments")
        if self.seq % self.segments:
            raise ValueError(f"segments {self.segments} do not divide seq {self.seq}")
        ordered = self.ranges_in_model_order()
        if schedule.bidirectional and self.vpp == 2:  # the model's stages twice: down, then up
            if ordered[: self.pp] != ordered[self.pp :]:
                raise ValueError(f"{self.schedule}'s up pipeline must run the down pipeline's stages: {ordered}")
            ordered = ordered[: self.pp]
        if ordered[0][0] != 0 or any(a[1] != b[0] for a, b in zip(ordered, ordered[1:])):
            raise ValueError(f"stage_layers do not cover the layers contiguously: {ordered}")
        if any(end < start for start, end in ordered):
            raise ValueError(f"stage_layers has an empty-negative range: {ordered}")
        return self

    def chunks_of(self, rank: int) -> list[LayerRange]:
        """The layer ranges of `rank`, one per chunk."""
        entry = self.stage_layers[rank]
        if self.vpp == 1 and entry and isinstance(entry[0], int):
            return [tuple(entry)]  # type: ignore[list-item]
        return [tuple(r) for r in entry]  # type: ignore[misc]

    def ranges_in_model_order(self) -> list[LayerRange]:
        """Every (rank, chunk) layer range, sorted by virtual stage (model order)."""
        by_stage: dict[int, LayerRange] = {}
        for rank in range(self.pp):
            chunks = self.chunks_of(rank)
            if len(chunks) != self.vpp:
                raise ValueError(f"rank {rank} has {len(chunks)} chunks, vpp is {self.vpp}")
            for chunk, layer_range in enumerate(chunks):
                by_stage[virtual_stage(rank, chunk, self.pp, self.schedule)] = layer_range
        return [by_stage[s] for s in sorted(by_stage)]

    def recompute_of(self, rank: int) -> str:
        """The recompute mode of pipeline rank `rank`."""
        return self.recompute[rank] if isinstance(self.recompute, list) else self.recompute

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


class ClusterSummary(BaseModel):
    """The cluster a plan was made for, by name (the GPU preset holds the rest)."""

    model_config = FROZEN

    gpu: str
    num_gpus: int
    gpus_per_node: int
    memory_limit_gb: float | None = None
    """The most predicted memory per GPU the plans were held to, GiB: the capacity less
    `memory_headroom`, over a calibration's memory scale."""
    memory_headroom: float | None = None
    """Share of the GPU's memory (or `--max-memory-gb`) the plans keep free."""


class PlanInputs(BaseModel):
    """The request a plan file answers, as far as re-costing it needs (`planner report`
    re-simulates the plans from these): cluster overrides and cost options. None: the preset's
    value or the option's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    """The GPU preset name as given (--gpu)."""
    num_gpus: int
    gpus_per_node: int | None = None
    intra_node_bw_gbps: float | None = None
    inter_node_bw_gbps: float | None = None
    max_memory_gb: float | None = None
    runtime: str | None = None
    attention: str | None = None
    cuda_graphs: bool = False
    interference: bool = True
    stragglers: bool = True
    speed_spread: str | None = None
    """--gpu-speed-spread as given (a built-in name or a file path)."""
    profile: str | None = None
    """Path of the measured profile (--profile), as given."""
    profile_only: bool = False
    calibration: str | None = None
    """Path of the calibration file (--calibration), as given."""
    precision: str = "bf16"
    moe_imbalance: float | None = None
    moe_dispatcher: str = "alltoall"
    moe_ep_overlap: bool = False
    """The MoE and precision cost options as given (--precision, --moe-imbalance,
    --moe-dispatcher, --moe-ep-overlap); each plan records what applied to it."""
    command: list[str] = Field(default_factory=list)
    """The command line that wrote the file."""


class PlanFile(BaseModel):
    """What `planner plan -o` writes and `planner export` reads: the contract plus what an
    exporter needs to rebuild the model and cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    plans: list[PlanEntry]
    model: ModelSpec | None = None
    cluster: ClusterSummary | None = None
    planner_version: str = ""
    cost_source: str = ""
    """"analytic" or the profile file the costs came from (each plan's `cost_sources` says,
    per layer kind, whether the profile measured it or the calibrated model filled it in)."""
    request: Request | None = None
    """The request the plans answer (`planner report` rebuilds the job from it)."""
    inputs: PlanInputs | None = None
    """The older record of the request, read from files written before `request`."""


def parse_plan_file(text: str, origin: str = "plan file") -> PlanFile:
    """Parse and validate a plan JSON document; ConfigError names the failing field."""
    try:
        return PlanFile.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, origin)) from None
