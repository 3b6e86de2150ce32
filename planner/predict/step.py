"""One training step of a layout: the simulated pipeline plus everything around it."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model import CostModel
from planner.cost.shapes import model_flops_per_token
from planner.layout import Layout
from planner.pipeline import ChunkCosts, PipelineTiming, pipeline_timing
from planner.plan import MemoryBreakdown, Predicted
from planner.predict.chunks import chunk_costs, mtp_places, unit_layer_costs
from planner.predict.data_parallel import (
    after_backward_times,
    exposed_dp_times,
    fsdp_copy_time,
    replica_sync_times,
    tied_embedding_done,
)
from planner.predict.memory import RankMemory, layout_memory, peak_activation_bytes
from planner.predict.moe_pairing import (
    combined_1f1b_excess,
    pairs_moe_comm,
    unpaired_share,
)
from planner.predict.shards import kind_counts, layout_shard, two_replicas
from planner.units import GiB


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Everything predicted for one layout (hot-path form of `plan.Predicted`)."""

    step_time_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    memory: tuple[RankMemory, ...]
    time_breakdown_s: dict[str, float]
    timing: PipelineTiming

    @property
    def peak_memory_bytes(self) -> float:
        return max(m.total for m in self.memory)

    def to_predicted(self) -> Predicted:
        """The JSON-contract form (memory in GiB)."""
        worst = max(self.memory, key=lambda m: m.total)
        return Predicted(
            step_time_s=self.step_time_s,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            bubble_fraction=self.bubble_fraction,
            memory_gb_per_stage=[round(m.total / GiB, 3) for m in self.memory],
            memory_reserved_gb_per_stage=[round(m.reserved / GiB, 3) for m in self.memory],
            memory_allocated_gb_per_stage=[round(m.allocated / GiB, 3) for m in self.memory],
            memory_breakdown_gb=MemoryBreakdown(
                weights=round(worst.weights / GiB, 3),
                grads=round(worst.grads / GiB, 3),
                optimizer=round(worst.optimizer / GiB, 3),
                activations=round(worst.activations / GiB, 3),
                other=round(worst.other / GiB, 3),
            ),
            time_breakdown_s={k: round(v, 6) for k, v in self.time_breakdown_s.items()},
        )


def _block_per_rank(model: CostModel, layout: Layout, seq: int, field: str) -> list[float]:
    """Per pipeline rank, the sum of its transformer layers' `field` in the rank's mode (and
    of its multi-token-prediction modules'), per unit (a mean segment under seq1f1b)."""
    shard, paired = layout_shard(layout, seq), pairs_moe_comm(model, layout)
    layer_costs = unit_layer_costs(model, layout)
    mtp_ranks = [rank for rank, _ in mtp_places(model, layout)]
    out = []
    for rank, per_rank in enumerate(layout.stage_layers):
        mode, alone = layout.recompute[rank], unpaired_share(model, layout, rank) if paired else 0.0

        def term(kind: str, mode: str = mode, alone: float = alone) -> float:
            value = getattr(layer_costs(kind, shard, mode, paired), field)
            return value + alone * (getattr(layer_costs(kind, shard, mode, False), field) - value) if alone else value

        total = sum(n * term(kind) for start, end in per_rank for kind, n in kind_counts(model, start, end))
        if rank in mtp_ranks:
            total += mtp_ranks.count(rank) * getattr(layer_costs("mtp", shard, mode, paired), field)
        out.append(total)
    return out


def predict(
    model: CostModel, layout: Layout, global_batch: int, seq: int, costs: ChunkCosts | None = None
) -> Prediction:
    """Step time, throughput, MFU, bubble and memory of `layout` for this job; `costs`, when
    the caller has them, are the layout's `chunk_costs` (the search's, from its bound)."""
    if costs is None:
        costs = chunk_costs(model, layout, seq)
    timing = pipeline_timing(costs, layout.schedule, layout.pp, layout.vpp, layout.num_microbatches)
    pp = layout.pp
    dp_exposed = exposed_dp_times(model, layout, costs)
    copies = [fsdp_copy_time(model, layout, costs.params[r], r) for r in range(pp)]
    sync = replica_sync_times(model, layout, costs)
    done = [timing.finish_s[r] + dp_exposed[r] + copies[r] + sync[r] for r in range(pp)]
    critical = max(range(pp), key=lambda r: done[r])
    grads_done = max(done[critical], tied_embedding_done(model, layout, done))
    tail = after_backward_times(model, layout, costs.params, costs.expert_params)
    step = grads_done + sum(tail.values())
    tokens = global_batch * seq
    model_flops = model_flops_per_token(model.spec, seq) * tokens
    peak = model.cluster.gpu.peak_flops(model.options.kernels.dtype)
    mfu = model_flops / (step * layout.num_gpus * peak)
    busy = timing.busy_s[critical]
    blocked = timing.blocked_s[critical] if timing.blocked_s else 0.0
    m = layout.num_microbatches * layout.segments  # units of ChunkCosts
    all_to_all = 0.0
    if model.spec.is_moe:
        all_to_all = (
            m * _block_per_rank(model, layout, seq, "moe_comm_s")[critical]
            + layout.num_microbatches * combined_1f1b_excess(model, layout, seq)[critical]
        )
    breakdown = {
        "compute": busy - m * costs.tp_comm_s[critical],
        "tp_cp_comm": m * costs.tp_comm_s[critical] - all_to_all,
        **({"moe_all_to_all": all_to_all} if model.spec.is_moe else {}),
        **({"pp_p2p_blocked": blocked} if timing.blocked_s else {}),
        "pipeline_bubble": timing.finish_s[critical] - busy - blocked,
        "dp_comm_exposed": dp_exposed[critical],
        **({"fsdp_copies": copies[critical]} if any(copies) else {}),
        **({"replica_grad_sync": sync[critical]} if two_replicas(layout) else {}),
        "tied_embedding_grad": grads_done - done[critical],
        **tail,
    }
    return Prediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        mfu=mfu,
        bubble_fraction=timing.bubble_fraction,
        memory=layout_memory(model, layout, costs, peak_activation_bytes(model, layout, seq, costs, timing)),
        time_breakdown_s=breakdown,
        timing=timing,
    )
