"""Meta's training framework for Llama 3 (not public), as the Llama 3 paper describes it.

Source: "The Llama 3 Herd of Models" (arXiv 2407.21783), section 3.3.2: FSDP-style sharding,
asynchronous pipeline sends, all-gather context parallelism.
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion

RUNTIME = "meta"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2024",
        summary="Llama 3's framework: all-gather context parallelism (exposed), TP backward collectives "
        "exposed (not public), fresh gradients per micro-batch",
        costs={"tp_backward_overlap": "none", "wgrad_accumulation": "none", "cp_comm": "all_gather"},
        sources=("arXiv 2407.21783 section 3.3.2",),
    ),
)
