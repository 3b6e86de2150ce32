"""HAI-LLM: DeepSeek's in-house framework, as the DeepSeek-V3 report describes it.

Source: DeepSeek-V3 technical report (arXiv 2412.19437), sections 3.2 and 3.3: DualPipe keeps two
copies of the parameters, RMSNorm / MLA up-projection / SwiGLU outputs recomputed, FP8 activation
caching.
"""

from __future__ import annotations

from planner.runtimes.base import RuntimeVersion

RUNTIME = "hai-llm"

VERSIONS = (
    RuntimeVersion(
        runtime=RUNTIME,
        version="2024",
        summary="DeepSeek-V3's framework: DualPipe's two parameter copies, recompute of norms, MLA "
        "up-projections and SwiGLU, FP8 activation caching",
        costs={
            "fp8_casts": "none",
            "tp_backward_overlap": "none",
            "wgrad_accumulation": "none",
            "parameter_copies": 2,
            "recompute_modules": ("layernorm", "mla_up_proj", "moe_act"),
            "activation_storage": "deepseek_fp8",
        },
        sources=("arXiv 2412.19437 sections 3.2.1, 3.2.3, 3.3.3",),
    ),
)
