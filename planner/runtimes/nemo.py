"""NeMo: NVIDIA's framework, its own defaults over megatron-core.

Sources: the Nemotron-4 340B technical report (2024); NeMo's megatron_gpt_config.yaml of 2024
(apply_rope_fusion, cross_entropy_loss_fusion off, grad_reduce in bf16). The attention kernel is
Transformer Engine's choice, as under megatron-core: from TE 1.2 (the version NeMo 1.23, the
24.01 container, installs) DotProductAttention disables FlashAttention where cuDNN's fused
attention runs the layer on an sm90 GPU ("Select FusedAttention on sm90 ... for performance"),
from TE 1.8 on any GPU of compute capability 9.0 or above ("on Hopper+").
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion

RUNTIME = "nemo"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2024",
        summary="NeMo 1.x/2.0 over megatron-core: bf16 gradient reduction, the loss op by op in fp32, "
        "RoPE unfused, blocking pipeline sends, Transformer Engine's cuDNN fused attention",
        costs={
            "grad_reduce_bytes": 2,
            "loss_passes": "vocab_parallel_fp32",
            "rope_fusion": False,
            "p2p_mode": "blocking",
        },
        prefers_cudnn=True,
        sources=(
            "Nemotron-4 340B technical report, arXiv 2406.11704",
            "NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (2024)",
            "NeMo v1.23.0 Dockerfile ('# Transformer Engine 1.2.0')",
            "TransformerEngine v1.2 transformer_engine/pytorch/attention.py (FusedAttention on sm90), "
            "v1.8 (on Hopper+)",
        ),
    ),
)
