"""InternLM's 2023 trainer: its own data parallelism ("hybrid ZeRO"), no pipeline.

Sources: InternLM/InternLM at c18bec9 (2023-07-08, the commit that fixed the numbers of
doc/en/train_performance.md): internlm/solver/optimizer/hybrid_zero_optim.py and
internlm/solver/optimizer/utils.py, configs/7B_sft.py, train.py, internlm/core/.
"""

from __future__ import annotations

from planner.runtimes.base import Rule, RuntimeVersion
from planner.runtimes.common import one_recompute_setting

RUNTIME = "internlm"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2023",
        summary="InternLM's hybrid ZeRO-1: bf16 gradients all-reduced in 512M-element buckets during the last "
        "backward, then each data-parallel rank broadcasts the shard it updated, one call per rank, after "
        "the step; autograd gradient accumulation, torch AdamW; FlashAttention-1; no pipeline",
        costs={
            "grad_reduce_bytes": 2,
            "grad_bucket_params": 512 * 1024 * 1024,
            "zero1_exchange": "all_reduce_broadcast",
            "overlap_grad_reduce": True,
            "overlap_param_gather": False,
            "wgrad_accumulation": "autograd",
            "optimizer_kernels": "foreach",
        },
        rules=(
            Rule(dimension="pp", allowed=(1,), why="InternLM's 2023 trainer has no pipeline scheduler"),
            Rule(dimension="cp", allowed=(1,), why="InternLM's 2023 trainer has no context parallelism"),
            Rule(dimension="zero", allowed=(0, 1), why="InternLM's hybrid ZeRO shards the optimizer states only"),
            one_recompute_setting("InternLM"),
        ),
        attention="flash1",
        sources=(
            "InternLM c18bec9 internlm/solver/optimizer/hybrid_zero_optim.py (reduce_tensor all-reduce per "
            "bucket, broadcast_params(overlap=False): one dist.broadcast per ZeRO rank)",
            "InternLM c18bec9 configs/7B_sft.py (hybrid_zero_optimizer: zero_overlap_communication=True, "
            "reduce_bucket_size=512 * 1024 * 1024)",
            "InternLM c18bec9 train.py (torch.optim.AdamW, one parameter group), internlm/core/"
            "no_pipeline_scheduler.py (gradients reduced in the last micro-batch only)",
            "InternLM doc/en/install.md (2023): 'Install flash-attention (version v1.0.5)' from "
            "third_party/flash-attention: FlashAttention-1's CUDA kernel",
        ),
    ),
)
