"""torchtitan: PyTorch's reference training runtime (FSDP2, DTensor TP, torch pipelining).

Sources: torchtitan 0.3.0 (torchtitan/distributed/activation_checkpoint.py: SelectiveAC's per-op
policy, FullAC with early_stop=False; parallelize_llama: fully_shard, DTensor's SequenceParallel on
(batch, seq, hidden)); torchtitan's 2024 Llama 3 8B benchmarks (docs/performance.md).
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion
from planner.runtimes.common import FOREIGN_ATTENTION, NO_COMBINED_1F1B, one_recompute_setting

RUNTIME = "torchtitan"

RULES = (one_recompute_setting("torchtitan"),)

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="0.3",
        summary="torchtitan 0.3: FSDP2, per-op selective checkpointing, eager SwiGLU, DTensor TP (backward "
        "collectives exposed, sequence-dim copies), fresh gradients per micro-batch",
        costs={
            "fp8_casts": "torchao",
            "selective_policy": "every_other_matmul",
            "eager_swiglu": True,
            "fsdp2": True,
            "tp_backward_overlap": "none",
            "sp_seq_dim_copies": True,
            "wgrad_accumulation": "none",
        },
        rules=RULES,
        exporter="torchtitan",
        unsupported={
            **FOREIGN_ATTENTION,
            ("moe_ep_overlap", True): NO_COMBINED_1F1B + "; its 0.3 ep_overlap is an experimental "
            "graph-compiler pass, not that schedule",
        },
        sources=(
            "torchtitan 0.3.0 torchtitan/distributed/activation_checkpoint.py, "
            "torchtitan/models/llama3/infra/parallelize.py",
        ),
    ),
    RuntimeVersion(
        runtime=RUNTIME,
        version="2024",
        summary="torchtitan of 2024 (its Llama 3 8B benchmarks): eager blocks (op-by-op elementwise traffic), "
        "torch's foreach AdamW, the eager fp32 loss, separate q/k/v projections",
        costs={
            "fp8_casts": "torchao",
            "selective_policy": "every_other_matmul",
            "optimizer_kernels": "foreach",
            "sac_fused_qkv": False,
            "fsdp2": True,
            "cross_entropy": "eager_fp32",
            "tp_backward_overlap": "none",
            "wgrad_accumulation": "none",
            "elementwise_traffic": 3.3,
        },
        rules=RULES,
        sources=("torchtitan docs/performance.md (2024)", "torchtitan train_configs/llama3_8b.toml (2024)"),
    ),
)
