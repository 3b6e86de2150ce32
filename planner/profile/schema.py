"""The profile file format: what `planner profile` measured, on which device, for which model.

A profile is one JSON document (pydantic, frozen, extra fields forbidden) holding the
environment it was measured in, the model shape it was measured for, one row per layer
shape and, optionally, collective-communication rows. Rows are keyed by
(kind, tp, mbs, seq, recompute); a key appears at most once. Times are milliseconds, memory
bytes; every number is for one micro-batch of `mbs` sequences of `seq` tokens through one
layer of `kind` on one GPU of a `tp`-way tensor-parallel group.

Versions: 1 is the original format. 2 adds, all optional so that every version-1 file still
loads unchanged: `block` (whose transformer block was measured), FLOP and operator counts per
phase on layer rows, and the `all_to_all` collective. Files are written as version 2.
"""

from __future__ import annotations

from itertools import product
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.cost.shapes import LAYER_KINDS
from planner.spec import ModelSpec

SCHEMA_VERSION = 2
FROZEN = ConfigDict(frozen=True, extra="forbid")

Kind = Literal["embedding", "transformer", "head"]
Recompute = Literal["none", "full"]
Status = Literal["ok", "oom", "error"]
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Block = Literal["planner", "torchtitan", "megatron"]

PROFILE_RECOMPUTE_MODES: tuple[str, ...] = Recompute.__args__  # type: ignore[attr-defined]
PROFILE_DTYPES = ("bf16", "fp16", "fp32")


class ShapeKey(NamedTuple):
    """The identity of a layer row."""

    kind: str
    tp: int
    mbs: int
    seq: int
    recompute: str

    def describe(self) -> str:
        """Short text form, e.g. `transformer tp=2 mbs=1 seq=4096`."""
        text = f"{self.kind} tp={self.tp} mbs={self.mbs} seq={self.seq}"
        return text + (f" recompute={self.recompute}" if self.recompute != "none" else "")


class LayerRow(BaseModel):
    """One layer kind measured at one shape."""

    model_config = FROZEN

    kind: Kind
    tp: int = Field(gt=0)
    mbs: int = Field(gt=0)
    seq: int = Field(gt=0)
    recompute: Recompute = "none"
    """"full": the transformer block's forward ran under activation checkpointing, so its
    backward-input time includes the recomputed forward."""
    status: Status
    """"ok"; "oom": the shape did not fit in memory (infeasible); "error": it failed otherwise."""
    message: str = ""
    """Why the shape is "oom" or "error"."""
    forward_ms: float | None = Field(default=None, ge=0)
    backward_input_ms: float | None = Field(default=None, ge=0)
    """Backward-input (I): gradients of the layer's input, as
    torch.distributed.pipelining's stage_backward_input computes them. Zero for the
    embedding: its input (token ids) has no gradient, and the runtime runs its whole
    backward in the weight step."""
    backward_weight_ms: float | None = Field(default=None, ge=0)
    """Backward-weight (W): gradients of the parameters from the saved intermediate
    gradients, as stage_backward_weight computes them."""
    backward_ms: float | None = Field(default=None, ge=0)
    """The full backward measured in one call (stage_backward), to check I + W against."""
    activation_bytes: int | None = Field(default=None, ge=0)
    """Distinct tensors autograd keeps for this layer's backward (deduplicated by storage,
    parameters excluded, the layer's input included when it is kept). Under recompute
    "full" it is the block input the checkpoint keeps for the recomputation."""
    forward_alloc_bytes: int | None = None
    """CUDA only: memory_allocated after the forward minus before it (the kept tensors and
    the layer's output, not its input: what the layer adds when layers are chained)."""
    peak_bytes: int | None = Field(default=None, ge=0)
    """CUDA only: the high-water mark of memory_allocated during forward and backward, above
    what was allocated before the forward (parameters, input, output gradient)."""
    param_count: int = Field(ge=0)
    """Parameters of the layer on one GPU of the TP group."""
    forward_flops: int | None = Field(default=None, ge=0)
    """FLOPs torch's FlopCounterMode counts in the forward (matrix multiplies, and attention
    where it has a formula: not CPU flash attention). Version 2."""
    backward_input_flops: int | None = Field(default=None, ge=0)
    backward_weight_flops: int | None = Field(default=None, ge=0)
    backward_flops: int | None = Field(default=None, ge=0)
    """The full backward's FLOPs: I + W when the split computes what the full backward does."""
    forward_ops: int | None = Field(default=None, ge=0)
    """ATen operators dispatched in the forward, views excluded (about the kernels launched
    on a GPU). Version 2."""
    backward_input_ops: int | None = Field(default=None, ge=0)
    backward_weight_ops: int | None = Field(default=None, ge=0)
    backward_ops: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _ok_rows_are_complete(self) -> LayerRow:
        if self.status == "ok":
            missing = [
                name
                for name in ("forward_ms", "backward_input_ms", "backward_weight_ms", "backward_ms", "activation_bytes")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"an ok row needs {', '.join(missing)}")
        if self.recompute == "full" and self.kind != "transformer":
            raise ValueError("recompute 'full' is measured for the transformer kind only")
        return self

    @property
    def key(self) -> ShapeKey:
        return ShapeKey(self.kind, self.tp, self.mbs, self.seq, self.recompute)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch."""
        return self.mbs * self.seq


class CollectiveRow(BaseModel):
    """One collective at one message size, timed across `world_size` ranks (nccl-tests
    conventions: `bytes` is the all-reduce buffer, the all-gather output, the
    reduce-scatter input, the all-to-all input on each rank, the point-to-point message)."""

    model_config = FROZEN

    op: CollectiveOp
    backend: str
    world_size: int = Field(gt=0)
    bytes: int = Field(gt=0)
    time_us: float = Field(gt=0)
    """Median over repeats of the slowest rank's time (one way for send_recv)."""
    algbw_gbps: float = Field(ge=0)
    """bytes / time, GB/s."""
    busbw_gbps: float = Field(ge=0)
    """algbw scaled to link traffic: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
    reduce-scatter, 1 for send_recv."""


class Profile(BaseModel):
    """A measured profile of one model on one device."""

    model_config = FROZEN

    schema_version: Literal[1, 2]
    device: str
    """The device's name as torch reports it (e.g. "NVIDIA H100 80GB HBM3"), or "cpu"."""
    device_type: Literal["cuda", "cpu"]
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    dtype: Literal["bf16", "fp16", "fp32"]
    warmup: int = Field(ge=0)
    repeats: int = Field(gt=0)
    memory_cap_bytes: int | None = Field(default=None, gt=0)
    """The memory limit the run was given (--memory-cap-gb), if any."""
    model: ModelSpec
    """The model shape the rows were measured for."""
    block: Block = "planner"
    """Whose transformer block the transformer rows measured (`planner profile --block`):
    planner's torch block, torchtitan's Llama block or megatron-core's local-spec layer.
    Version 2; version-1 files measured planner's."""
    rows: tuple[LayerRow, ...] = ()
    collectives: tuple[CollectiveRow, ...] = ()

    @model_validator(mode="after")
    def _unique_keys(self) -> Profile:
        seen: set[ShapeKey] = set()
        for row in self.rows:
            if row.key in seen:
                raise ValueError(f"two rows for {row.key.describe()}")
            seen.add(row.key)
        return self

    def row_map(self) -> dict[ShapeKey, LayerRow]:
        """Rows by key."""
        return {row.key: row for row in self.rows}

    def with_row(self, row: LayerRow) -> Profile:
        """This profile with `row` added, replacing any row of the same key."""
        rows = tuple(r for r in self.rows if r.key != row.key) + (row,)
        return self.model_copy(update={"rows": rows})

    def with_collectives(self, new: list[CollectiveRow]) -> Profile:
        """This profile with `new` collective rows, replacing rows of the same op, backend,
        world size and message size."""
        keys = {(c.op, c.backend, c.world_size, c.bytes) for c in new}
        kept = tuple(c for c in self.collectives if (c.op, c.backend, c.world_size, c.bytes) not in keys)
        return self.model_copy(update={"collectives": kept + tuple(new)})


def shape_keys(
    kinds: list[str], tps: list[int], mbss: list[int], seqs: list[int], recomputes: list[str]
) -> list[ShapeKey]:
    """Every shape to measure, in a stable order (by tp, seq, mbs, kind). Recompute "full"
    is measured only where it differs from "none": the transformer kind."""
    keys = []
    for tp, seq, mbs, kind, recompute in product(tps, seqs, mbss, LAYER_KINDS, PROFILE_RECOMPUTE_MODES):
        if kind in kinds and recompute in recomputes and (recompute == "none" or kind == "transformer"):
            keys.append(ShapeKey(kind, tp, mbs, seq, recompute))
    return keys
