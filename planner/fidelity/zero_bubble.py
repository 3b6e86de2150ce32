"""Published zero-bubble vs 1F1B throughput ratios against planner's predictions.

Qi, Wan, Huang, Lin 2024 ("Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241)
measure samples per GPU per second of 1F1B, interleaved 1F1B, their automatic zero-bubble
schedules and ZB-V on A100 SXM 80GB nodes, pure pipeline parallelism (one GPU per stage).
tests/bench/published_zb.toml keeps every number with its table and setup. For each setup
this module predicts every schedule with `planner.predict.predict` (the code path of
`planner evaluate`) and compares RATIOS, which cancel the absolute-rate error:

    ratio            = samples/s of schedule X / samples/s of 1F1B, same setup
    ratio error      = predicted ratio / published ratio - 1

The paper's schedules map to planner's as:

    1F1B    -> "1f1b"
    1F1B-I  -> "interleaved_1f1b" with one transformer layer per chunk, the paper's "maximum
               number of chunks ... each transformer layer serves as a chunk"
    ZB-1p   -> "zb_h1": the automatic schedule under a p M_B memory limit; the paper's Table 5
               gives ZB-1p exactly ZB-H1's bubble rate in all 12 settings ("this improvement is
               not observed in ZB-1p vs ZB-H1 ... the memory limit becomes the dominate factor")
    ZB-2p   -> "zb_h2" (and, reported beside it, planner.schedule.auto_zb at a 2p limit, the
               paper's own ZB-2p; its Table 5 puts ZB-2p's bubble at 0.1-4 % where ZB-H2 has 3-11 %)
    ZB-2p*  -> as ZB-2p, at the row's halved micro-batch size and doubled micro-batch count
    ZB-V    -> "zbv"

How the runs were configured (sail-sg/zero-bubble-pipeline-parallelism, tag zero-bubble-v0.1.0,
examples/pretrain_zero_bubble.sh, the script released with the paper): Megatron-LM's GPT
(pre-LayerNorm, GeLU MLP of 4h, learned positions, embeddings tied), `--fp16`, no
`--use-flash-attn` (Megatron's unfused attention: QK^T GEMM, fused scale-mask-softmax,
dropout, AV GEMM), Megatron's default dropout 0.1, `--allow-padding-num-layers` (layers padded
to a multiple of p; the first and last (virtual) stage each lose one layer: the paper's "both
the initial and final pipeline stages possess one fewer transformer layer"), and for
interleaving `--num-layers-per-virtual-pipeline-stage 1` over the padded layers (so
V = padded layers / p, and the first and last chunk hold no layer). Vocabulary: 32000 (the
script's SentencePiece tokenizer), the one size with tied embeddings for which Table 3's
layers and widths add up to the published 1.5B / 6.2B / 14.6B / 28.3B (50,304 would give
14.7B and 28.4B). Cost options: Megatron-LM's (`runtime_cost_options("megatron")`) with
those flags. Pipeline sends: 1F1B and 1F1B-I run Megatron-LM's own schedules, whose p2p_mode
"megatron-lm" blocks in plain 1F1B (the fork's megatron/arguments.py: "Setting
args.overlap_p2p_comm to False since non-interleaved schedule does not support overlapping p2p
communication") and overlaps in interleaved 1F1B; the zero-bubble schedules run the fork's own
scheduler (megatron/core/pipeline_parallel/zb_schedules.py), which posts each batch of sends and
receives with `torch.distributed.batch_isend_irecv` (`fused_pipeline_ops`) and waits on a
receive only before the F or B that consumes it (`schedule_f`: `for h in input_tensor[1]:
h.wait()`): p2p_mode "overlapped" for them.

The paper also publishes the per-pass times it profiled (appendix D): `pass_time_errors`
compares them with the cost model's forward, input-gradient and weight-gradient passes of one
micro-batch on a full middle stage, a component-level check under the ratios.

Pure computation: `load_rows` and `load_pass_times` are the only functions that read a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.catalog import resolve_gpu
from planner.cost.model import CostModel
from planner.errors import ConfigError
from planner.fidelity.published import load_tables
from planner.job import runtime_cost_options
from planner.layout import Layout, check_layout, stage_layers_from_counts
from planner.pipeline import stage_costs
from planner.predict import chunk_costs, predict
from planner.schedule import auto_zero_bubble, compile_order, simulate
from planner.spec import Cluster, ModelSpec

PaperSchedule = Literal["1F1B", "1F1B-I", "ZB-1p", "ZB-2p", "ZB-2p*", "ZB-V"]
BASELINE: PaperSchedule = "1F1B"
GPU = "a100-80gb"
VOCAB = 32000
"""The vocabulary that makes Table 3's models the published sizes (module docstring)."""
MAX_POSITIONS = 2048
"""examples/pretrain_zero_bubble.sh: --max-position-embeddings 2048."""

PLANNER_SCHEDULE: dict[str, str] = {
    "1F1B": "1f1b",
    "1F1B-I": "interleaved_1f1b",
    "ZB-1p": "zb_h1",
    "ZB-2p": "zb_h2",
    "ZB-2p*": "zb_h2",
    "ZB-V": "zbv",
}
"""The paper's schedule -> the planner schedule it is predicted with."""
ZB_RUNTIME = frozenset({"ZB-1p", "ZB-2p", "ZB-2p*", "ZB-V"})
"""Schedules the fork's zero-bubble scheduler runs (the others run Megatron-LM's schedules)."""
ZB_P2P_MODE = "overlapped"
"""How that scheduler's sends and receives run (module docstring: zb_schedules.py)."""
AUTO_MEMORY_LIMIT: dict[str, int] = {"ZB-1p": 1, "ZB-2p": 2, "ZB-2p*": 2}
"""The paper's automatic schedules: activation memory limit in units of p micro-batches."""


class ZbRow(BaseModel):
    """One [[row]] of published_zb.toml (the file's header describes every field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    setup: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    table: str = Field(min_length=5)
    model: str = Field(pattern=r"^gpt-[0-9.]+b$")
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    hidden: int = Field(gt=0)
    seq: int = Field(gt=0)
    gpus: int = Field(gt=1)
    gpus_per_node: int = Field(gt=0)
    mbs: int = Field(gt=0)
    microbatches: int = Field(gt=0)
    schedule: PaperSchedule
    samples_per_gpu_per_s: float = Field(gt=0)
    quote: str = Field(min_length=40)
    source: str = Field(min_length=20)
    url: str = Field(pattern=r"^https://")

    @model_validator(mode="after")
    def _shape(self) -> ZbRow:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.microbatches < self.gpus:
            raise ValueError(f"{self.microbatches} micro-batches < {self.gpus} stages: 1F1B is not defined there")
        return self

    @property
    def global_batch(self) -> int:
        return self.mbs * self.microbatches


class PassTimes(BaseModel):
    """One [[pass_times]] table of published_zb.toml: the paper's profiled T_F, T_B, T_W, T_comm."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    setup: str
    forward_ms: float = Field(gt=0)
    backward_input_ms: float = Field(gt=0)
    backward_weight_ms: float = Field(gt=0)
    comm_ms: float = Field(gt=0)
    quote: str = Field(min_length=40)
    source: str = Field(min_length=20)
    url: str = Field(pattern=r"^https://")


@dataclass(frozen=True, slots=True)
class PassTimeResult:
    """Predicted / published - 1 of each pass on a full middle stage (and of the p2p time)."""

    setup: str
    forward: float
    backward_input: float
    backward_weight: float
    comm: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RatioResult:
    """One schedule of one setup: published and predicted throughput and ratio to 1F1B."""

    row: ZbRow
    planner_schedule: str
    vpp: int
    published_ratio: float
    predicted_ratio: float
    predicted_samples_per_gpu_per_s: float
    auto_ratio: float | None = None
    """ZB-1p/2p: the ratio with planner.schedule.auto_zb's order at the paper's memory limit."""

    @property
    def ratio_error(self) -> float:
        """Predicted ratio / published ratio - 1 (negative: the gain over 1F1B under-predicted)."""
        return self.predicted_ratio / self.published_ratio - 1.0

    @property
    def auto_ratio_error(self) -> float | None:
        return None if self.auto_ratio is None else self.auto_ratio / self.published_ratio - 1.0

    @property
    def absolute_error(self) -> float:
        """Predicted / published samples per GPU per second - 1 (the absolute rate's error)."""
        return self.predicted_samples_per_gpu_per_s / self.row.samples_per_gpu_per_s - 1.0


@dataclass(frozen=True, slots=True)
class RatioSummary:
    """Ratio errors over the non-baseline rows."""

    rows: int
    mean_abs: float
    mean_signed: float
    max_abs: float
    worst: str


def load_rows(path: Path) -> list[ZbRow]:
    """Every [[row]] of a published zero-bubble TOML file, checked: one 1F1B row per setup, and
    every row of a setup on the same model and GPUs."""
    rows = load_tables(path, "row", ZbRow, "published zero-bubble rows")
    for setup, group in by_setup(rows).items():
        names = [r.schedule for r in group]
        if names.count(BASELINE) != 1 or len(set(names)) != len(names):
            raise ConfigError(f"{path}: setup {setup} needs one row per schedule and one 1F1B row, has {names}")
        if len({(r.model, r.layers, r.hidden, r.heads, r.gpus, r.seq, r.global_batch) for r in group}) != 1:
            raise ConfigError(f"{path}: setup {setup} mixes models, GPUs or global batches")
    return rows


def load_pass_times(path: Path) -> list[PassTimes]:
    """Every [[pass_times]] table of a published zero-bubble TOML file."""
    return load_tables(path, "pass_times", PassTimes, "published pass times")


def pass_time_errors(rows: list[ZbRow], published: list[PassTimes]) -> list[PassTimeResult]:
    """Per profiled setup, the cost model's F, I, W and p2p seconds of one micro-batch on its
    ZB-2p layout's middle rank (a full stage) against the paper's T_F, T_B, T_W, T_comm."""
    results = []
    for times in published:
        row = next(r for r in rows if r.setup == times.setup and r.schedule == "ZB-2p")
        model, layout = build(row)
        costs = chunk_costs(model, layout, row.seq)
        rank = row.gpus // 2
        predicted = (
            costs.forward_s[rank][0],
            costs.backward_input_s[rank][0],
            costs.backward_weight_s[rank][0],
            costs.p2p_s,
        )
        measured = (times.forward_ms, times.backward_input_ms, times.backward_weight_ms, times.comm_ms)
        errors = [p * 1e3 / m - 1.0 for p, m in zip(predicted, measured, strict=True)]
        results.append(PassTimeResult(times.setup, *errors))
    return results


def by_setup(rows: list[ZbRow]) -> dict[str, list[ZbRow]]:
    """Rows grouped by setup, in file order."""
    groups: dict[str, list[ZbRow]] = {}
    for row in rows:
        groups.setdefault(row.setup, []).append(row)
    return groups


def model_spec(row: ZbRow) -> ModelSpec:
    """The paper's GPT-style model of this row (Table 3 dims; module docstring for the rest)."""
    return ModelSpec(
        name=row.model,
        family="gpt",
        num_layers=row.layers,
        hidden_size=row.hidden,
        num_attention_heads=row.heads,
        num_kv_heads=row.heads,
        ffn_hidden_size=4 * row.hidden,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        norm="layernorm",
        activation="gelu",
        position_embedding="learned",
        tie_embeddings=True,
        qkv_bias=True,
        linear_bias=True,
    )


def padded_stage_counts(layers: int, stages: int) -> list[int]:
    """Layers per virtual stage under the fork's --allow-padding-num-layers: the layer count
    padded up to a multiple of `stages`, evenly cut, then one layer taken from each of the last
    and first stages per padding layer (megatron/legacy/model/transformer.py `get_offset`:
    `for _index in range(-1, num_padding - 1): chunk_sizes[_index] -= 1`)."""
    padding = -layers % stages
    counts = [(layers + padding) // stages] * stages
    for index in range(-1, padding - 1):
        counts[index] -= 1
    if min(counts) < 0:
        raise ValueError(f"{layers} layers cannot be padded over {stages} stages")
    return counts


def vpp_of(row: ZbRow) -> int:
    """Chunks per rank: 1, 2 for ZB-V, one padded layer per chunk for 1F1B-I."""
    if row.schedule == "ZB-V":
        return 2
    if row.schedule == "1F1B-I":
        return (row.layers + -row.layers % row.gpus) // row.gpus
    return 1


def build(row: ZbRow) -> tuple[CostModel, Layout]:
    """The cost model and layout of one row (pure pipeline parallelism, one GPU per stage)."""
    spec = model_spec(row)
    gpu = resolve_gpu(GPU)
    cluster = Cluster.of(gpu, row.gpus, gpus_per_node=row.gpus_per_node)
    schedule, vpp = PLANNER_SCHEDULE[row.schedule], vpp_of(row)
    cuts = stage_layers_from_counts(
        padded_stage_counts(row.layers, row.gpus * vpp), row.layers, row.gpus, vpp, schedule
    )
    layout = Layout(
        tp=1,
        pp=row.gpus,
        dp=1,
        vpp=vpp,
        mbs=row.mbs,
        num_microbatches=row.microbatches,
        schedule=schedule,
        recompute=("none",) * row.gpus,
        zero_stage=0,
        stage_layers=cuts,
    )
    check_layout(layout, spec, cluster, row.global_batch, row.seq)
    options = runtime_cost_options("megatron", gpu, attention="unfused").with_fields(
        dtype="fp16", dropout=True, **({"p2p_mode": ZB_P2P_MODE} if row.schedule in ZB_RUNTIME else {})
    )
    return CostModel(spec, cluster, options), layout


@lru_cache(maxsize=512)
def predicted_samples_per_gpu_per_s(row: ZbRow) -> float:
    """Samples per GPU per second `planner.predict` gives this row's layout."""
    model, layout = build(row)
    return row.global_batch / predict(model, layout, row.global_batch, row.seq).step_time_s / row.gpus


def auto_samples_per_gpu_per_s(row: ZbRow) -> float:
    """Samples per GPU per second with the pipeline run in planner.schedule.auto_zb's order at
    the row's memory limit (p or 2p micro-batches): predict's step with the hand-crafted
    schedule, its simulated pipeline span replaced by the automatic order's."""
    model, layout = build(row)
    costs = chunk_costs(model, layout, row.seq)
    prediction = predict(model, layout, row.global_batch, row.seq, costs)
    staged = stage_costs(costs)
    order = auto_zero_bubble(staged, row.microbatches, AUTO_MEMORY_LIMIT[row.schedule] * row.gpus)
    auto_span = max(simulate(compile_order(order), staged).finish_s)
    step = prediction.step_time_s - max(prediction.timing.finish_s) + auto_span
    return row.global_batch / step / row.gpus


def evaluate(rows: list[ZbRow], *, auto: bool = True) -> list[RatioResult]:
    """Every non-baseline row against its setup's 1F1B row (with `auto`, the automatic
    zero-bubble order's ratio too)."""
    results = []
    for group in by_setup(rows).values():
        base = next(r for r in group if r.schedule == BASELINE)
        base_rate = predicted_samples_per_gpu_per_s(base)
        for row in group:
            if row is base:
                continue
            rate = predicted_samples_per_gpu_per_s(row)
            auto_rate = auto_samples_per_gpu_per_s(row) if auto and row.schedule in AUTO_MEMORY_LIMIT else None
            results.append(
                RatioResult(
                    row=row,
                    planner_schedule=PLANNER_SCHEDULE[row.schedule],
                    vpp=vpp_of(row),
                    published_ratio=row.samples_per_gpu_per_s / base.samples_per_gpu_per_s,
                    predicted_ratio=rate / base_rate,
                    predicted_samples_per_gpu_per_s=rate,
                    auto_ratio=None if auto_rate is None else auto_rate / base_rate,
                )
            )
    return results


def baseline_errors(rows: list[ZbRow]) -> dict[str, float]:
    """Per setup, the 1F1B row's predicted / published samples per GPU per second - 1."""
    return {
        r.setup: predicted_samples_per_gpu_per_s(r) / r.samples_per_gpu_per_s - 1.0
        for r in rows
        if r.schedule == BASELINE
    }


def summarize(errors: dict[str, float]) -> RatioSummary:
    """Mean |error|, mean signed error, worst |error| and its name over named ratio errors."""
    if not errors:
        raise ValueError("no ratio errors to summarise")
    worst = max(errors, key=lambda k: abs(errors[k]))
    values = list(errors.values())
    return RatioSummary(
        rows=len(values),
        mean_abs=sum(abs(e) for e in values) / len(values),
        mean_signed=sum(values) / len(values),
        max_abs=abs(errors[worst]),
        worst=worst,
    )


def row_name(result: RatioResult) -> str:
    """'<setup> <paper schedule>': a result's name in tables and summaries."""
    return f"{result.row.setup} {result.row.schedule}"
