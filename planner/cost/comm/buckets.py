"""How many gradient-reduction calls Megatron-LM's DDP makes per step, and of what size.

megatron-core (0.19, core/distributed/distributed_data_parallel.py): with overlap_grad_reduce the
bucket size defaults to max(40,000,000, 1,000,000 x DP size) parameters ("larger DP sizes need
larger buckets to ensure collectives do not become latency-bound"); pipeline ranks after the
first turn bucketing off (one bucket holding the whole stage, since their reduction is off the
critical path), and so does overlap_grad_reduce=False. Each bucket is one reduce-scatter (or
all-reduce) call, and with the distributed optimizer one parameter all-gather, each paying the
call latency.
"""

from __future__ import annotations

import math

MIN_BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def megatron_bucket_params(dp: int) -> int:
    """Megatron-LM's default DDP bucket size (parameters) for a DP group of `dp` ranks."""
    return max(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * dp)


def grad_bucket_count(
    params: float,
    dp: int,
    pipeline_rank: int = 0,
    overlap: bool = True,
    every_rank: bool = False,
    bucket_params: int = 0,
) -> int:
    """Number of gradient buckets (one collective each) for `params` local parameters;
    `every_rank`: the runtime buckets on every pipeline rank (ZeRO-2: DeepSpeed), not only
    on the first as Megatron's DDP does; `bucket_params`: the runtime's own bucket size
    (0: Megatron-LM's default, `megatron_bucket_params`)."""
    if params <= 0:
        return 0
    if not overlap or (pipeline_rank > 0 and not every_rank):
        return 1
    return math.ceil(params / (bucket_params or megatron_bucket_params(dp)))
