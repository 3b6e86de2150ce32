"""DeepSpeed: its pipeline engine, alone (today's exporter) or under Megatron-DeepSpeed.

Sources: deepspeed/runtime/pipe/engine.py and p2p.py (blocking send then receive, activations
and their gradients sent as 1/TP partitions since v0.5.4), deepspeed/runtime/bf16_optimizer.py;
the BLOOM and MT-NLG training reports.
"""

from __future__ import annotations

from planner.runtimes.base import Rule, RuntimeVersion
from planner.runtimes.common import FOREIGN_ATTENTION, NO_COMBINED_1F1B, one_recompute_setting

RUNTIME = "deepspeed"

_MEGATRON_DEEPSPEED = {
    "dropout": True,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
    "tp_backward_overlap": "none",
    "grad_reduce_bytes": 2,
}
"""What both Megatron-DeepSpeed engines share: dropout on, fp16/bf16 gradient reduction after the
backward, no distributed optimizer, TP backward collectives exposed, unfused attention."""

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="0.19",
        summary="DeepSpeed 0.19's PipelineModule and pipeline engine: blocking sends, each micro-batch's "
        "gradient taken as it comes",
        costs={"p2p_mode": "deepspeed", "wgrad_accumulation": "none"},
        rules=(
            Rule(
                dimension="schedules",
                pipelined_only=True,
                allowed=("1f1b",),
                why="DeepSpeed's pipeline engine runs its own 1F1B-like TrainSchedule with one stage per rank",
            ),
            one_recompute_setting("DeepSpeed"),
            Rule(
                dimension="tp",
                allowed=(1,),
                why="tensor parallelism needs Megatron-DeepSpeed, not DeepSpeed's PipelineModule",
            ),
            Rule(
                dimension="cp",
                allowed=(1,),
                why="context parallelism needs Megatron-DeepSpeed, not DeepSpeed's PipelineModule",
            ),
            Rule(
                dimension="recompute",
                allowed=("none", "full"),
                why="selective recompute has no DeepSpeed equivalent (its pipeline recomputes whole layers)",
            ),
            Rule(
                dimension="zero",
                pipelined_only=True,
                allowed=(0, 1),
                why="DeepSpeed's pipeline engine allows ZeRO stage 0 or 1 only",
            ),
        ),
        exporter="deepspeed",
        unsupported={
            **FOREIGN_ATTENTION,
            ("moe_dispatcher", "deepep"): "has no DeepEP token dispatcher",
            ("moe_ep_overlap", True): NO_COMBINED_1F1B,
        },
        sources=("deepspeed 0.19 runtime/pipe/engine.py, runtime/pipe/p2p.py",),
    ),
    RuntimeVersion(
        runtime=RUNTIME,
        version="megatron-2022",
        summary="Megatron-DeepSpeed as BLOOM ran it (2022): BF16_Optimizer, activations and gradients sent "
        "as 1/TP partitions, blocking sends",
        costs={**_MEGATRON_DEEPSPEED, "wgrad_accumulation": "none", "p2p_mode": "deepspeed", "bf16_optimizer": True},
        attention="unfused",
        sources=("bigscience-workshop/Megatron-DeepSpeed (2022)", "deepspeed v0.6 runtime/bf16_optimizer.py"),
    ),
    RuntimeVersion(
        runtime=RUNTIME,
        version="megatron-2021",
        summary="Megatron-DeepSpeed as MT-NLG ran it (2021, before DeepSpeed v0.5.4): gradients sent whole, "
        "autograd gradient accumulation, the loss op by op in fp32",
        costs={
            **_MEGATRON_DEEPSPEED,
            "loss_passes": "vocab_parallel_fp32",
            "wgrad_accumulation": "autograd",
            "p2p_mode": "deepspeed-whole-grads",
        },
        attention="unfused",
        sources=("Smith et al. 2022, arXiv 2201.11990", "deepspeed v0.5.3 runtime/pipe/engine.py"),
    ),
)
