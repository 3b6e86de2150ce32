"""Predict one layout: per-chunk costs from the cost model, the pipeline schedule's timing,
data-parallel communication and the per-step work after the backward, memory per pipeline rank.

    grads = max(max_r(finish_r + exposed_dp_r), max(done_0, done_last) + tied_embedding)
    step  = grads + max_r(loss_scale_r) + max_r(grad_norm_r) + max_r(optimizer_r)

finish_r is when pipeline rank r ends its last compute action in the schedule simulation (the
simulator charges the p2p time, latency plus bytes over bandwidth, on every cross-rank
dependency, the warm-up's P - 1 hops included; when the runtime's sends block, the sending
action holds its rank for it instead: `send_holds`, CostOptions.pipeline.p2p_mode); exposed_dp_r
is the part of its gradient reduction (and, with a distributed optimizer, the parameter
all-gather) that its buckets cannot hide behind the last micro-batch's backward (first
micro-batch's forward), one collective call per Megatron-LM DDP bucket (FSDP: per layer), each
paying its own latency, or, when longer, the slowdown the overlapped part causes in that
compute (planner/cost/overlap.py); under Megatron's interleaved 1F1B each model chunk is
reduced on its own once its last micro-batch's backward has run (`interleaved_dp_exposed`);
done_r = finish_r + exposed_dp_r. The tied embedding's all-reduce, fp16's loss-scale check,
the gradient norm and the Adam step are planner/cost/step.py's. Each term is a key of
`time_breakdown_s`, whose values sum to the step time."""

from planner.predict.chunks import (
    chunk_costs,
    mtp_places,
    p2p_mode,
    send_holds,
    unit_layer_costs,
)
from planner.predict.data_parallel import (
    after_backward_times,
    exposed_dp_time,
    exposed_dp_times,
    fsdp_copy_time,
    interleaved_dp_exposed,
    optimizer_time,
    replica_sync_times,
    tied_embedding_done,
)
from planner.predict.memory import (
    RankMemory,
    layout_memory,
    peak_activation_bytes,
)
from planner.predict.moe_pairing import (
    combined_1f1b_chunk_pairs,
    combined_1f1b_excess,
    combined_1f1b_runs,
    pairs_moe_comm,
    priced_options,
    runs_combined_1f1b,
    unpaired_share,
)
from planner.predict.shards import (
    dp_equivalent_params,
    dp_shards,
    fsdp_root_params,
    kind_counts,
    layers_on,
    layout_shard,
    replica_ends,
    two_replicas,
)
from planner.predict.step import (
    Prediction,
    predict,
)

__all__ = [
    "Prediction",
    "RankMemory",
    "after_backward_times",
    "chunk_costs",
    "combined_1f1b_chunk_pairs",
    "combined_1f1b_excess",
    "combined_1f1b_runs",
    "dp_equivalent_params",
    "dp_shards",
    "exposed_dp_time",
    "exposed_dp_times",
    "fsdp_copy_time",
    "fsdp_root_params",
    "interleaved_dp_exposed",
    "kind_counts",
    "layers_on",
    "layout_memory",
    "layout_shard",
    "mtp_places",
    "optimizer_time",
    "p2p_mode",
    "pairs_moe_comm",
    "peak_activation_bytes",
    "predict",
    "priced_options",
    "replica_ends",
    "replica_sync_times",
    "runs_combined_1f1b",
    "send_holds",
    "tied_embedding_done",
    "two_replicas",
    "unit_layer_costs",
    "unpaired_share",
]
