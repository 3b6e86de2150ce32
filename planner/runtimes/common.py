"""Refusal texts several runtimes share."""

from __future__ import annotations

from planner.runtimes.base import Rule

FOREIGN_ATTENTION = {
    ("attention", "flash1"): "does not run FlashAttention-1's CUDA kernel (--attention flash1: flash-attn 0.x / 1.x, "
    "which the current releases replaced with FlashAttention-2)",
    ("attention", "triton_fa1"): "does not run llm-foundry's Triton FlashAttention (--attention triton_fa1: "
    "MPT's attn_impl 'triton' under composer)",
}
"""Attention kernels that no runtime the planner exports to runs."""

NO_COMBINED_1F1B = (
    "has no equivalent of Megatron-LM's combined-1F1B all-to-all overlap (overlap_moe_expert_parallel_comm)"
)


def one_recompute_setting(runtime: str) -> Rule:
    """The rule of a runtime that applies one recompute setting to every stage and layer (no
    per-rank recompute)."""
    return Rule(
        dimension="per_rank_recompute",
        allowed=(False,),
        why=f"{runtime} applies one recompute setting to every stage",
    )
