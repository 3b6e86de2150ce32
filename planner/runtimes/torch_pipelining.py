"""torch.distributed.pipelining: the training script `planner export --to torch` writes.

Sources: torch/distributed/pipelining/schedules.py; torch.utils.checkpoint (non-reentrant, early
stop on by default); DTensor tensor parallelism (each backward collective its own autograd op).
"""

from __future__ import annotations

from planner.runtimes.base import Rule, RuntimeVersion
from planner.runtimes.common import FOREIGN_ATTENTION, NO_COMBINED_1F1B

RUNTIME = "torch"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2.13",
        summary="torch 2.13's pipelining schedules with DTensor TP: backward collectives exposed, non-reentrant "
        "checkpoint with early stop, sends overlapping compute",
        costs={
            "fp8_casts": "torchao",
            "tp_backward_overlap": "none",
            "recompute_early_stop": True,
            "wgrad_accumulation": "none",
        },
        rules=(Rule(dimension="cp", allowed=(1,), why="context parallelism is not in the exported script"),),
        exporter="torch",
        unsupported={
            **FOREIGN_ATTENTION,
            ("moe_dispatcher", "deepep"): "sends tokens with torch.distributed.all_to_all_single, not DeepEP's kernels",
            ("moe_ep_overlap", True): NO_COMBINED_1F1B,
        },
        sources=("torch 2.13 torch/distributed/pipelining/schedules.py", "torch/utils/checkpoint.py"),
    ),
)
