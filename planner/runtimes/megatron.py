"""Megatron-LM: NVIDIA's training runtime, from the 2021 code of the SC'21 paper to megatron-core 0.19.

Sources: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21); Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022); the Megatron-LM repository (megatron/p2p_communication.py, megatron/optimizer/,
megatron/model/fused_*, megatron/training/arguments.py) and megatron-core's pipeline schedules.
docs/cost_options.md says what each cost option means.
"""

from __future__ import annotations

from planner.runtimes.base import Rule, RuntimeVersion
from planner.runtimes.common import FOREIGN_ATTENTION, one_recompute_setting

RUNTIME = "megatron"

RULES = (
    Rule(
        dimension="schedules",
        pipelined_only=True,
        allowed=("1f1b", "interleaved_1f1b"),
        why="Megatron-LM runs 1F1B (vpp=1) and interleaved 1F1B (vpp>=2) only (no GPipe, looped BFS, "
        "ZB-H1/H2, ZB-V or DualPipeV)",
    ),
    one_recompute_setting("Megatron-LM"),
)

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="0.19",
        summary="megatron-core 0.19 with its training script: blocking sends in plain 1F1B, overlapped in "
        "interleaved 1F1B; the MoE layer's own op count on DeepEP",
        costs={"p2p_mode": "megatron-lm", "megatron_moe_ops": True},
        rules=RULES,
        prefers_cudnn=True,
        exporter="megatron",
        unsupported=dict(FOREIGN_ATTENTION),
        sources=(
            "Megatron-LM megatron/training/arguments.py (--no-overlap-p2p-communication)",
            "megatron-core pipeline_parallel/schedules.py, moe/moe_layer.py",
        ),
    ),
    RuntimeVersion(
        runtime=RUNTIME,
        version="2022",
        summary="Megatron-LM v3 (Korthikanti 2022): sequence parallelism and selective recompute, "
        "gradient-accumulation fusion, dropout on, unfused attention, no distributed optimizer, "
        "blocking sends, gradient reduction after the backward",
        costs={"dropout": True, "overlap_grad_reduce": False, "overlap_param_gather": False, "p2p_mode": "blocking"},
        rules=RULES,
        attention="unfused",
        sources=("Korthikanti et al. 2022, arXiv 2205.05198", "Megatron-LM v3.0 megatron/p2p_communication.py"),
    ),
    RuntimeVersion(
        runtime=RUNTIME,
        version="2021",
        summary="the SC'21 code: Megatron-LM's local DDP (three passes over the gradients), 16-bit gradients "
        "cast to fp32 main gradients, autograd gradient accumulation, the loss op by op in fp32, "
        "TP backward collectives exposed, dropout on, unfused attention, blocking sends",
        costs={
            "dropout": True,
            "overlap_grad_reduce": False,
            "overlap_param_gather": False,
            "tp_backward_overlap": "none",
            "grad_reduce_bytes": 2,
            "loss_passes": "vocab_parallel_fp32",
            "main_grad_cast": True,
            "ddp_grad_copy_passes": 3,
            "wgrad_accumulation": "autograd",
            "p2p_mode": "blocking",
        },
        rules=RULES,
        attention="unfused",
        sources=(
            "Narayanan et al. 2021, arXiv 2104.04473",
            "Megatron-LM 2021 megatron/model/distributed.py, megatron/optimizer/optimizer.py",
        ),
    ),
)
