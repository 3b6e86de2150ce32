"""NeMo: NVIDIA's framework, its own defaults over megatron-core.

Sources: the Nemotron-4 340B technical report (2024); NeMo's megatron_gpt_config.yaml of 2024
(apply_rope_fusion, cross_entropy_loss_fusion off, grad_reduce in bf16).
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion

RUNTIME = "nemo"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2024",
        summary="NeMo 1.x/2.0 over megatron-core: bf16 gradient reduction, the loss op by op in fp32, "
        "RoPE unfused, blocking pipeline sends",
        costs={
            "grad_reduce_bytes": 2,
            "loss_passes": "vocab_parallel_fp32",
            "rope_fusion": False,
            "p2p_mode": "blocking",
        },
        sources=(
            "Nemotron-4 340B technical report, arXiv 2406.11704",
            "NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (2024)",
        ),
    ),
)
