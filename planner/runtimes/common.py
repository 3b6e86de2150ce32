"""Refusal texts several runtimes share."""

from __future__ import annotations

FOREIGN_ATTENTION = {
    ("attention", "triton_fa1"): "does not run llm-foundry's Triton FlashAttention (--attention triton_fa1: "
    "MPT's attn_impl 'triton' under composer)",
}
"""Attention kernels that no runtime the planner exports to runs."""

NO_COMBINED_1F1B = (
    "has no equivalent of Megatron-LM's combined-1F1B all-to-all overlap (overlap_moe_expert_parallel_comm)"
)
