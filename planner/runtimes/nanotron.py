"""Hugging Face nanotron: Megatron-style tensor and pipeline parallelism in eager PyTorch, its
own fp32 gradient accumulator and ZeRO-1.

Sources: huggingface/nanotron at c2528430 (the commit of the README's v0.5 benchmarks):
src/nanotron/trainer.py, helpers.py, optim/gradient_accumulator.py, optim/zero.py,
distributed.py, parallel/pipeline_parallel/engine.py and p2p.py, examples/config_tiny_llama.yaml.
"""

from __future__ import annotations

from planner.runtimes.base import Rule, RuntimeVersion
from planner.runtimes.common import one_recompute_setting

RUNTIME = "nanotron"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="0.5",
        summary="nanotron v0.5 with fp32 gradient accumulation: each micro-batch's bf16 weight gradients "
        "added into an fp32 buffer; under ZeRO-1 the whole buffer all-reduced after the backward and the "
        "updated shards all-gathered after the step, neither overlapped; without ZeRO, DDP's 25 MB buckets "
        "all-reduced in fp32 during the last backward; blocking pipeline sends; fused torch AdamW",
        costs={
            "grad_reduce_bytes": 4,
            "wgrad_accumulation": "fp32_buffer",
            "zero1_exchange": "all_reduce_all_gather",
            "grad_bucket_params": 25 * 1024 * 1024 // 2,
            "overlap_grad_reduce": True,
            "overlap_param_gather": False,
            "p2p_mode": "blocking",
        },
        rules=(
            Rule(
                dimension="schedules",
                pipelined_only=True,
                allowed=("gpipe", "1f1b"),
                why="nanotron's pipeline engines are all-forward-all-backward and 1F1B (no interleaving)",
            ),
            Rule(dimension="cp", allowed=(1,), why="nanotron v0.5 has no context parallelism"),
            Rule(dimension="zero", allowed=(0, 1), why="nanotron v0.5 shards the optimizer states only (ZeRO-1)"),
            one_recompute_setting("nanotron"),
        ),
        sources=(
            "nanotron c2528430 trainer.py (no DDP wrapper under ZeRO-1 with fp32 accumulation; "
            "sync_gradients_across_dp after the pipeline's backward: all_reduce of the contiguous fp32 buffer)",
            "nanotron c2528430 optim/gradient_accumulator.py (FP32GradientAccumulator._accumulate_grad: "
            "fp32_grad.add_(half_param.grad) after every micro-batch; get_fp32_accum_hook for DDP buckets)",
            "nanotron c2528430 optim/zero.py (_all_gather_params after the step: one all_gather_coalesced)",
            "nanotron c2528430 config/config.py (ddp_bucket_cap_mb 25), examples/config_tiny_llama.yaml "
            "(accumulate_grad_in_fp32, torch_adam_is_fused: true, pp_engine 1f1b)",
            "nanotron c2528430 parallel/pipeline_parallel/p2p.py (send_tensors waits on its isend)",
        ),
    ),
)
