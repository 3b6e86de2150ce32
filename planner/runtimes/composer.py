"""composer / llm-foundry: MosaicML's trainer (FSDP1) as the MPT benchmarks ran it.

Sources: llm-foundry scripts/train/benchmarking (2023): FSDP FULL_SHARD with bf16 mixed precision
(gradients reduced in bf16), torch's foreach AdamW, MPT's Triton FlashAttention (attn_impl 'triton').
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion

RUNTIME = "composer"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2023",
        summary="composer's FSDP1 (flat gradient concatenated each micro-batch), bf16 gradient reduction, "
        "foreach AdamW, llm-foundry's Triton FlashAttention",
        costs={
            "tp_backward_overlap": "none",
            "grad_reduce_bytes": 2,
            "optimizer_kernels": "foreach",
            "fsdp1_grad_cat": True,
            "wgrad_accumulation": "none",
        },
        attention="triton_fa1",
        sources=("llm-foundry scripts/train/benchmarking/README.md (2023)",),
    ),
)
