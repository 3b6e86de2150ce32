"""What the user brings: the model (`ModelSpec`) and the hardware (`GpuSpec`, `Cluster`).

These are pydantic models (frozen, extra fields forbidden) because they are read from files
and the command line; the cost model reads their attributes directly. `model_from_hf_config`
turns a Hugging Face style `config.json` dictionary into a `ModelSpec`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import ConfigError, LayoutError
from planner.units import GiB

FROZEN = ConfigDict(frozen=True, extra="forbid")


class RopeScaling(BaseModel):
    """RoPE frequency scaling for a context longer than the one first trained: Llama 3.1's
    ("llama3": wavelengths above original / low_freq_factor divided by `factor`, those below
    original / high_freq_factor kept, the band between blended) or YaRN ("yarn", DeepSeek-V3:
    frequencies ramped between interpolation and extrapolation by beta_fast / beta_slow, the
    attention scaled by mscale)."""

    model_config = FROZEN

    rope_type: Literal["llama3", "yarn"]
    factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(gt=0)
    low_freq_factor: float = Field(default=1.0, gt=0)
    """llama3 only."""
    high_freq_factor: float = Field(default=4.0, gt=0)
    """llama3 only."""
    beta_fast: float = Field(default=32.0, gt=0)
    """yarn only: rotations at which the ramp starts interpolating."""
    beta_slow: float = Field(default=1.0, gt=0)
    """yarn only: rotations below which frequencies are fully interpolated."""
    mscale: float = 1.0
    """yarn only: the cos/sin tables' scale factor (0.1 mscale ln(factor) + 1 over that of
    mscale_all_dim)."""
    mscale_all_dim: float = 0.0
    """yarn only: the softmax scale is multiplied by (0.1 mscale_all_dim ln(factor) + 1)^2."""


class ModelSpec(BaseModel):
    """A decoder-only transformer: Llama style (RMSNorm, GQA, SwiGLU, RoPE) or GPT style
    (LayerNorm, MHA with biases, GeLU MLP, learned or ALiBi positions), optionally MoE."""

    model_config = FROZEN

    name: str = "custom"
    family: Literal["llama", "gpt"]
    """Block style: "llama" (pre-RMSNorm, SwiGLU, RoPE) or "gpt" (pre-LayerNorm, GeLU)."""
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    """Key/value heads; equal to num_attention_heads for MHA, fewer for GQA/MQA."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width; hidden_size // num_attention_heads when unset."""
    ffn_hidden_size: int = Field(gt=0)
    """Width of the MLP's hidden layer (per expert for MoE unless moe_ffn_hidden_size)."""
    vocab_size: int = Field(gt=0)
    """Rows of the word embedding (and LM head) as the model's checkpoint has them, any
    padding of the tokenizer's vocabulary included (GPT-2's 50257, Megatron's GPT runs' 51200)."""
    max_position_embeddings: int = Field(gt=0)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_eps: float = Field(default=1e-5, gt=0)
    """Epsilon of every norm (RMSNorm's rms_norm_eps, LayerNorm's layer_norm_epsilon)."""
    activation: Literal["swiglu", "gelu", "squared_relu"] = "swiglu"
    """MLP activation: SwiGLU (gate and up matrices), GeLU or squared ReLU (Nemotron-4; one up
    matrix like GeLU's)."""
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base: the rotation of channel pair i is position / rope_theta^(2i/d)."""
    rope_scaling: RopeScaling | None = None
    """Long-context RoPE scaling (Llama 3.1, DeepSeek-V3); None: plain RoPE."""
    rotary_percent: float = Field(default=1.0, gt=0.0, le=1.0)
    """Share of each q and k head's width that RoPE rotates (Megatron's `rotary_percent`; the
    rest passes through): Nemotron-4's 0.5."""
    qk_norm: bool = False
    """An RMSNorm over each head's query and key before RoPE, one head_dim-wide weight each,
    shared by the heads (Qwen3's q_norm and k_norm)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Each token attends to the last `sliding_window` positions only (Mistral-7B v0.1: 4096);
    None: full causal attention. Sequences no longer than the window see no difference."""
    tie_embeddings: bool = False
    """Input embedding and LM head share one matrix."""
    qkv_bias: bool = False
    linear_bias: bool = False
    """Biases on the output projection and MLP linears (GPT-2/3 style)."""
    embedding_norm: bool = False
    """A norm right after the word embedding (BLOOM)."""
    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer; 0 for a dense model."""
    moe_top_k: int = Field(default=0, ge=0)
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    moe_score_function: Literal["softmax", "sigmoid"] = "softmax"
    """How the router turns its logits into expert scores."""
    moe_norm_topk_prob: bool = True
    """The top-k scores renormalised to sum to 1 (Mixtral, Qwen3, DeepSeek-V3); False: used as
    they are (Qwen2-MoE, DeepSeek-V2)."""
    moe_routed_scaling_factor: float = Field(default=1.0, gt=0)
    """Factor on the routed experts' weights (DeepSeek-V3's routed_scaling_factor 2.5)."""
    moe_router_num_groups: int | None = Field(default=None, gt=0)
    """Group-limited routing: the experts in this many equal groups, a token choosing its
    top-k among the `moe_router_group_topk` best groups only (DeepSeek-V3: 8 groups, 4 chosen)."""
    moe_router_group_topk: int | None = Field(default=None, gt=0)
    moe_router_group_score: Literal["top2_sum", "max"] = "top2_sum"
    """How group-limited routing ranks the groups: by the sum of each group's two best scores
    (DeepSeek-V3's noaux_tc) or by its best one (DeepSeek-V2's group_limited_greedy)."""
    moe_router_expert_bias: bool = False
    """A per-expert bias added to the scores to choose the experts, not to weight them
    (DeepSeek-V3's aux-loss-free balancing, `e_score_correction_bias`)."""
    moe_shared_expert_gate: bool = False
    """The shared experts' output scaled by sigmoid(x . w), one hidden-wide weight (Qwen2-MoE)."""
    shared_expert_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """Total hidden width of the shared experts; num_shared_experts x the expert width when unset."""
    first_dense_layers: int = Field(default=0, ge=0)
    """Leading layers with a dense MLP of width ffn_hidden_size (DeepSeek's first_k_dense_replace)."""
    moe_layer_freq: int = Field(default=1, gt=0)
    """After the dense ones, layer i (0-based) is MoE when (i + 1) % moe_layer_freq == 0
    (Qwen's decoder_sparse_step); the others are dense."""
    moe_capacity_factor: float | None = Field(default=None, gt=0)
    """Tokens an expert takes at most, relative to an even share; None: dropless routing."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: rank of the query's down-projection (None: a full query projection)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: rank of the joint key/value compression; set, the model uses latent attention."""
    qk_rope_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head width of the rotary part of q and k (k's rotary part is shared by heads)."""
    qk_nope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    mtp_depth: int = Field(default=0, ge=0)
    """Multi-token-prediction modules after the last layer (DeepSeek-V3: 1)."""
    published_params: float | None = None
    """Parameter count the model's authors report (documentation and tests only)."""
    published_active_params: float | None = None
    """Parameters per token the authors of an MoE model report (documentation and tests only)."""
    source: str = ""

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}); give head_dim explicitly"
            )
        if self.num_experts and not 0 < self.moe_top_k <= self.num_experts:
            raise ValueError(f"moe_top_k must be in 1..num_experts ({self.num_experts})")
        if self.num_experts and not self.num_moe_layers:
            raise ValueError("first_dense_layers and moe_layer_freq leave no MoE layer")
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError("latent attention (kv_lora_rank) needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        if self.qk_norm and (self.kv_lora_rank or self.norm != "rmsnorm"):
            raise ValueError(
                "qk_norm is a per-head RMSNorm of queries and keys in a RMSNorm model without latent "
                "attention (which normalises its latents instead)"
            )
        if self.rope_scaling is not None and self.position_embedding != "rope":
            raise ValueError("rope_scaling needs position_embedding 'rope'")
        self._check_router_groups()
        return self

    def _check_router_groups(self) -> None:
        """Group-limited routing: both numbers or neither, groups dividing the experts."""
        groups, chosen = self.moe_router_num_groups, self.moe_router_group_topk
        if (groups is None) != (chosen is None):
            raise ValueError("moe_router_num_groups and moe_router_group_topk go together")
        if groups is not None and (self.num_experts % groups or chosen > groups):
            raise ValueError(
                f"moe_router_num_groups ({groups}) must divide num_experts ({self.num_experts}) "
                f"and be at least moe_router_group_topk ({chosen})"
            )

    @property
    def kv_channels(self) -> int:
        """Per-head width d."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_ffn_width(self) -> int:
        """Hidden width of all shared experts together (0 without any)."""
        if not self.num_shared_experts:
            return 0
        return self.shared_expert_ffn_hidden_size or self.num_shared_experts * self.expert_ffn_hidden_size

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3) instead of MHA/GQA."""
        return self.kv_lora_rank is not None

    def is_moe_layer(self, index: int) -> bool:
        """Whether transformer layer `index` (0-based) has routed experts."""
        return self.is_moe and index >= self.first_dense_layers and (index + 1) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers)) if self.is_moe else 0

    def block_fields(self, tp: int = 1, seq: int | None = None) -> dict[str, Any]:
        """Keyword arguments of `planner.torch_blocks.BlockConfig` for this model, with heads
        and the FFN divided by `tp` (one tensor-parallel shard); `seq` sets the length of the
        RoPE tables (learned positions keep the model's table)."""
        return {
            "family": self.family,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_attention_heads // tp,
            "num_kv_heads": max(1, self.num_kv_heads // tp),
            "head_dim": self.kv_channels,
            "ffn_hidden_size": self.ffn_hidden_size // tp,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_position_embeddings if self.position_embedding == "learned" or not seq else seq,
            "norm": self.norm,
            "norm_eps": self.norm_eps,
            "activation": self.activation,
            "position_embedding": self.position_embedding,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.model_dump() if self.rope_scaling else None,
            "rotary_percent": self.rotary_percent,
            "qk_norm": self.qk_norm,
            "tie_embeddings": self.tie_embeddings,
            "qkv_bias": self.qkv_bias,
            "linear_bias": self.linear_bias,
            "embedding_norm": self.embedding_norm,
        }


GEMM_TABLE_FIELDS = ("gemm_table", "fp8_gemm_table")
"""The GpuEfficiency fields that name measured GEMM tables (bf16, fp8)."""


class GpuEfficiency(BaseModel):
    """Fractions of datasheet peak the analytic cost model assumes (see planner/cost/compute.py)."""

    model_config = FROZEN

    gemm: float = Field(gt=0, le=1)
    """Achieved fraction of peak tensor FLOP/s on a large, well-shaped GEMM."""
    gemm_half_dim: float = Field(gt=0)
    """GEMM dimension at which a GEMM reaches half of `gemm` (small-shape falloff)."""
    gemm_table: str | None = None
    """Data file in planner/presets with this GPU's measured GEMM FLOP/s by (m, n, k)
    (planner/cost/gemm_table.py). When set, GEMMs in the table's dtype (bf16; fp16 runs at
    the same peak) take their rate from it times `gemm_table_scale`, in place of
    `gemm` x s(m) s(n) s(k); fp8 GEMMs (unless `fp8_gemm_table`) and calibration keep
    `gemm`/`gemm_half_dim`."""
    fp8_gemm_table: str | None = None
    """The same for fp8 GEMMs (e4m3 operands, bf16 output): FP8 linears take their rate from it
    times `gemm_table_scale`, in place of the fp8 peak x `gemm` x s(m) s(n) s(k)."""
    gemm_table_scale: float = Field(default=1.0, gt=0)
    """Factor on `gemm_table`'s rates: below 1 for a part slower than the measured one (e.g.
    a lower power limit); a calibration from the user's runs may move it."""
    attention_fwd: float = Field(gt=0, le=1)
    attention_bwd: float = Field(gt=0, le=1)
    hbm: float = Field(gt=0, le=1)
    """Achieved fraction of HBM bandwidth for memory-bound (elementwise) kernels."""
    intra_node_comm: float = Field(gt=0, le=1)
    inter_node_comm: float = Field(gt=0, le=1)
    kernel_overhead_us: float = Field(ge=0)
    """Fixed launch/tail cost charged per kernel."""
    source: str = ""
    # Attention kernels, host time per op, overlap interference (docs/kernel_floor.md).
    # attention_fwd/attention_bwd above are FlashAttention-2's rates (what torch SDPA's flash
    # backend runs and `planner profile` measures); other fused kernels have their own, None
    # where the kernel does not run on this GPU.
    flash1_fwd: float | None = Field(default=None, gt=0, le=1)
    """Forward fraction of peak of FlashAttention-1's CUDA kernel (flash-attn 0.x / 1.x,
    HazyResearch; MPT's attn_impl 'flash', Megatron-LM's --use-flash-attn of 2023)."""
    flash1_bwd: float | None = Field(default=None, gt=0, le=1)
    flash3_fwd: float | None = Field(default=None, gt=0, le=1)
    flash3_bwd: float | None = Field(default=None, gt=0, le=1)
    cudnn_fwd: float | None = Field(default=None, gt=0, le=1)
    cudnn_bwd: float | None = Field(default=None, gt=0, le=1)
    triton_fa1_fwd: float | None = Field(default=None, gt=0, le=1)
    """Forward fraction of peak of llm-foundry's Triton FlashAttention (attn_impl 'triton':
    flash_attn_triton.py on the pre-MLIR Triton compiler, a FlashAttention-1-class kernel)."""
    triton_fa1_bwd: float | None = Field(default=None, gt=0, le=1)
    attention_table: str | None = None
    """Data file in planner/presets with this GPU's measured fused-attention times by sequence
    length (planner/cost/attention_table.py). The kernels it measured take its falloff in
    sequence length, relative to its reference length where the rates above are stated, in
    place of the `gemm_half_dim` falloff."""
    attention_source: str = ""
    host_op_us_forward: float = Field(default=0.0, ge=0)
    """Host time per dispatched op in an eager forward (Python, autograd recording, ATen
    dispatch, kernel launch): the floor a layer cannot run faster than without CUDA graphs."""
    host_op_us_backward: float = Field(default=0.0, ge=0)
    """Host time per dispatched op in the backward (the C++ autograd engine)."""
    host_source: str = ""
    comm_sm_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Fraction of the GPU's SMs a collective's kernels occupy while they run beside compute."""
    overlap_source: str = ""
    sustained_compute: float = Field(default=1.0, gt=0, le=1)
    """Factor on the compute-bound rates (GEMM table or prior, attention) for a training run's
    steady state: the GPU's sustained over its burst matmul throughput where those rates were
    timed in short bursts (1: they are sustained rates, or no such measurement)."""
    sustained_compute_source: str = ""


class GpuSpec(BaseModel):
    """One accelerator model and the node it usually sits in (datasheet numbers)."""

    model_config = FROZEN

    name: str
    vendor: str
    description: str
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per dtype (bf16, fp16, fp8, tf32, fp32)."""
    memory_gib: float = Field(gt=0)
    hbm_bw_gbps: float = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    intra_node_bw_gbps: float = Field(gt=0)
    """Scale-up (NVLink/Infinity Fabric) bandwidth per GPU, one direction."""
    intra_node_latency_us: float = Field(ge=0)
    inter_node_bw_gbps: float = Field(gt=0)
    """Scale-out (InfiniBand/RoCE) bandwidth per GPU, one direction."""
    inter_node_latency_us: float = Field(ge=0)
    sm_count: int | None = Field(default=None, gt=0)
    """Streaming multiprocessors (datasheet), for kernels that hold a fixed number of them
    beside compute (DeepEP's normal kernels); None: not given."""
    fp8_gemm_layouts: Literal["tn", "any"] = "tn"
    """The operand layouts its FP8 GEMMs take: "tn" only (Hopper; Transformer Engine writes each
    fp8 operand transposed as well) or "any" (Blackwell: no transposes). Transformer Engine's
    `is_non_tn_fp8_gemm_supported`: compute capability 10.x or 13+ (planner/cost/fp8_casts.py)."""
    efficiency: GpuEfficiency
    source: str = ""
    speed_spread: str | None = None
    """Measured population of per-GPU compute speed (planner/presets/gpu_speed_spread.toml)
    whose slowest-of-N sets a job's compute pace (planner/cost/stragglers.py); None: none."""
    speed_spread_source: str = ""

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; ConfigError if the GPU has no such tensor mode."""
        if dtype not in self.peak_tflops:
            raise ConfigError(
                f"GPU {self.name} has no {dtype} peak in its preset (has: {', '.join(sorted(self.peak_tflops))})"
            )
        return self.peak_tflops[dtype] * 1e12


class Cluster(BaseModel):
    """The GPUs a job runs on: how many, of which kind, and how they are wired."""

    model_config = FROZEN

    gpu: GpuSpec
    num_gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    intra_node_bw_gbps: float = Field(gt=0)
    intra_node_latency_us: float = Field(ge=0)
    inter_node_bw_gbps: float = Field(gt=0)
    inter_node_latency_us: float = Field(ge=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)
    """Memory a job may use per GPU; the GPU's capacity when unset."""
    memory_headroom: float = Field(default=0.0, ge=0, lt=1)
    """Share of that memory plans keep free for what the model under-predicts."""
    memory_scale: float = Field(default=1.0, gt=0)
    """Measured over predicted peak memory on the user's own runs (a calibration's); 1: none."""

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def memory_capacity_bytes(self) -> float:
        """Memory a job may use per GPU: `--max-memory-gb`, or the GPU's."""
        return (self.memory_limit_gib or self.gpu.memory_gib) * GiB

    @property
    def memory_limit_bytes(self) -> float:
        """The most predicted memory a plan may use per GPU: the capacity less the headroom,
        over the calibrated memory scale."""
        return self.memory_capacity_bytes * (1 - self.memory_headroom) / self.memory_scale

    @classmethod
    def of(cls, gpu: GpuSpec, num_gpus: int, **overrides: Any) -> Cluster:
        """A cluster of `num_gpus` `gpu`s with the preset's node wiring unless overridden."""
        fields = {
            "gpus_per_node": min(gpu.gpus_per_node, num_gpus),
            "intra_node_bw_gbps": gpu.intra_node_bw_gbps,
            "intra_node_latency_us": gpu.intra_node_latency_us,
            "inter_node_bw_gbps": gpu.inter_node_bw_gbps,
            "inter_node_latency_us": gpu.inter_node_latency_us,
        }
        fields.update({k: v for k, v in overrides.items() if v is not None})
        per_node = fields["gpus_per_node"]
        if num_gpus > per_node and num_gpus % per_node:
            raise LayoutError(
                f"{num_gpus} GPUs do not fill whole nodes of {per_node}; "
                f"use a multiple of {per_node} or set --gpus-per-node"
            )
        try:
            return cls(gpu=gpu, num_gpus=num_gpus, **fields)
        except ValidationError as exc:
            raise ConfigError(validation_message(exc, "cluster")) from None


def validation_message(exc: ValidationError, what: str) -> str:
    """One line naming the first failing field of a pydantic error."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{what}: field '{where}': {err['msg']}{extra}"


_HF_LLAMA_TYPES = {
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
}
_HF_GPT_TYPES = {"gpt2", "gpt_bigcode", "bloom"}
HF_MODEL_TYPES = tuple(sorted(_HF_LLAMA_TYPES | _HF_GPT_TYPES))
"""The Hugging Face `model_type`s whose config.json the planner reads; it refuses any other."""


def model_from_hf_config(config: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` dictionary of one of HF_MODEL_TYPES
    (llama/mistral/qwen/mixtral/deepseek keys such as `hidden_size`, `num_key_value_heads`,
    `intermediate_size`; gpt2/gpt_bigcode/bloom keys such as `n_embd`, `n_head`, `n_layer`,
    `n_inner`, `n_positions`). ConfigError names the field, or the model_type it does not read."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type in _HF_GPT_TYPES:
        fields = _gpt_fields(config)
    elif model_type in _HF_LLAMA_TYPES:
        fields = _llama_fields(config, model_type)
    else:
        raise ConfigError(_unknown_model_type(name, model_type))
    try:
        return ModelSpec(name=name, source="Hugging Face config.json", **fields)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, f"model config {name}")) from None


def _unknown_model_type(name: str, model_type: str) -> str:
    """Why a config.json of an architecture the planner does not read is refused, and the
    ones it does."""
    what = f"model_type '{model_type}' is not" if model_type else "no model_type names"
    return (
        f"model config {name}: {what} an architecture the planner reads (supported model_types: "
        f"{', '.join(HF_MODEL_TYPES)}); describe another in a planner model file with `family` llama or gpt"
    )


def _require(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    raise ConfigError(f"model config: missing field '{keys[0]}'")


def _llama_fields(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    heads = _require(config, "num_attention_heads")
    experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts") or 0
    fields: dict[str, Any] = {
        "family": "llama",
        "num_layers": _require(config, "num_hidden_layers"),
        "hidden_size": _require(config, "hidden_size"),
        "num_attention_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "ffn_hidden_size": _require(config, "intermediate_size"),
        "vocab_size": _require(config, "vocab_size"),
        "max_position_embeddings": config.get("max_position_embeddings", 4096),
        # Source: transformers' config classes (MixtralConfig rms_norm_eps 1e-5, the others 1e-6)
        "norm_eps": config.get("rms_norm_eps") or (1e-5 if model_type == "mixtral" else 1e-6),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "qkv_bias": bool(config.get("attention_bias", model_type.startswith("qwen2"))),
        "linear_bias": bool(config.get("mlp_bias", False)),
        "qk_norm": model_type in _HF_QK_NORM_TYPES,
        "sliding_window": _sliding_window(config, model_type),
        **_rope_fields(config),
    }
    activation = config.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise ConfigError(
            f"model config: hidden_act '{activation}' is not supported; a {model_type} MLP the "
            "planner reads is SwiGLU (silu)"
        )
    if config.get("head_dim"):
        fields["head_dim"] = config["head_dim"]
    if experts:
        fields["num_experts"] = experts
        fields["moe_top_k"] = _require(config, "num_experts_per_tok")
        fields |= _router_fields(config, model_type)
        if config.get("moe_intermediate_size"):
            fields["moe_ffn_hidden_size"] = config["moe_intermediate_size"]
        if config.get("shared_expert_intermediate_size"):  # qwen2_moe: one gated shared expert
            fields["num_shared_experts"] = 1
            fields["shared_expert_ffn_hidden_size"] = config["shared_expert_intermediate_size"]
            fields["moe_shared_expert_gate"] = True
        if config.get("n_shared_experts"):  # deepseek: n experts of moe_intermediate_size
            fields["num_shared_experts"] = config["n_shared_experts"]
        if config.get("first_k_dense_replace"):
            fields["first_dense_layers"] = config["first_k_dense_replace"]
        freq = config.get("decoder_sparse_step") or config.get("moe_layer_freq") or 1
        if freq > 1:
            fields["moe_layer_freq"] = freq
        if config.get("mlp_only_layers"):
            raise ConfigError(
                "model config: mlp_only_layers (dense layers at chosen places) is not "
                "supported; only leading dense layers and a regular MoE frequency"
            )
    if config.get("kv_lora_rank"):
        fields.update(
            kv_lora_rank=config["kv_lora_rank"],
            q_lora_rank=config.get("q_lora_rank"),
            qk_rope_head_dim=_require(config, "qk_rope_head_dim"),
            qk_nope_head_dim=_require(config, "qk_nope_head_dim"),
            v_head_dim=_require(config, "v_head_dim"),
        )
    if config.get("num_nextn_predict_layers"):
        fields["mtp_depth"] = config["num_nextn_predict_layers"]
    return fields


_HF_QK_NORM_TYPES = {"qwen3", "qwen3_moe"}
"""model_types whose attention normalises each head's query and key (Qwen3's q_norm, k_norm)."""


def _rope_fields(config: dict[str, Any]) -> dict[str, Any]:
    """rope_theta and rope_scaling of a config.json (transformers 4's `rope_theta` and
    `rope_scaling`, or 5's `rope_parameters`); ConfigError for a scaling the planner does
    not model."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    fields: dict[str, Any] = {"rope_theta": float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)}
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return fields
    if kind not in ("llama3", "yarn"):
        raise ConfigError(f"model config: rope_scaling type '{kind}' is not supported (llama3, yarn)")
    keys = set(RopeScaling.model_fields) - {"rope_type"}
    fields["rope_scaling"] = {"rope_type": kind, **{k: params[k] for k in keys if params.get(k) is not None}}
    return fields


def _sliding_window(config: dict[str, Any], model_type: str) -> int | None:
    """The attention window of a config.json: Mistral's `sliding_window` (every layer); Qwen's
    only with `use_sliding_window`, refused (it keeps the first max_window_layers layers full)."""
    if not model_type.startswith("qwen"):
        return config.get("sliding_window")
    if config.get("use_sliding_window"):
        raise ConfigError(
            "model config: use_sliding_window (a window on the layers after max_window_layers) is not supported"
        )
    return None


def _router_fields(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The MoE router of a config.json: score function, renormalised top-k, routed scaling
    factor, group-limited routing and DeepSeek-V3's expert bias (`topk_method` noaux_tc)."""
    # Source: transformers' modeling code: Mixtral always renormalises, DeepSeek-V3 always routes
    # by noaux_tc; DeepseekV3Config's norm_topk_prob defaults to True, the other configs' to False
    method = config.get("topk_method") or ("noaux_tc" if model_type == "deepseek_v3" else "greedy")
    fields = {
        "moe_score_function": config.get("scoring_func", "softmax"),
        "moe_norm_topk_prob": model_type == "mixtral"
        or bool(config.get("norm_topk_prob", model_type == "deepseek_v3")),
        "moe_routed_scaling_factor": float(config.get("routed_scaling_factor") or 1.0),
        "moe_router_expert_bias": method == "noaux_tc",
    }
    if method in ("group_limited_greedy", "noaux_tc") and (config.get("n_group") or 1) > 1:
        fields |= {
            "moe_router_num_groups": config["n_group"],
            "moe_router_group_topk": _require(config, "topk_group"),
            "moe_router_group_score": "max" if method == "group_limited_greedy" else "top2_sum",
        }
    return fields


def _gpt_fields(config: dict[str, Any]) -> dict[str, Any]:
    hidden = _require(config, "n_embd", "hidden_size", "n_embed")  # n_embed: early BLOOM configs
    heads = _require(config, "n_head", "num_attention_heads")
    is_bloom = str(config.get("model_type", "")).lower() == "bloom"
    activation = config.get("activation_function", "gelu")
    if not activation.startswith("gelu"):
        raise ConfigError(f"model config: activation_function '{activation}' is not supported (GeLU)")
    return {
        "family": "gpt",
        "num_layers": _require(config, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": 1 if config.get("multi_query") else heads,
        "ffn_hidden_size": config.get("n_inner") or 4 * hidden,
        "vocab_size": _require(config, "vocab_size"),
        "max_position_embeddings": config.get("n_positions") or config.get("seq_length") or 2048,
        "norm": "layernorm",
        "norm_eps": config.get("layer_norm_epsilon", 1e-5),  # Source: transformers' GPT2Config / BloomConfig default
        "activation": "gelu",
        "position_embedding": "alibi" if is_bloom else "learned",
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "qkv_bias": True,
        "linear_bias": True,
        "embedding_norm": is_bloom,
    }
