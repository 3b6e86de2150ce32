"""The transformer block a runtime trains with, built at one tensor-parallel rank's shape.

`planner profile --block` picks whose block the `transformer` rows measure:

- `planner`: `planner.torch_blocks.TransformerBlock`, the block of the exported torch script,
  written to save what fused kernels save (Megatron-LM with Transformer Engine);
- `torchtitan`: torchtitan 0.3's `Llama3TransformerBlock`, built from the same factories
  (`make_gqa_config`, `make_ffn_config`, fused QKV, complex RoPE) and shapes that
  `planner export --to torchtitan` writes, eager as torchtitan's stock recipes run it. Its
  inner attention is torchtitan's `ScaledDotProductAttention` instead of the language
  models' `FlexAttention`, which only runs compiled (torch.compile); both keep q, k, v, the
  output and the log-sum-exp for backward;
- `megatron`: megatron-core's `TransformerLayer` from `get_gpt_layer_local_spec` (plain
  PyTorch modules, no Transformer Engine), after initialising model-parallel state with one
  process. It builds on any device, but its `DotProductAttention` takes its scores buffer
  from a CUDA global memory buffer: its forward needs a GPU.

A TP shard is what one of `tp` ranks holds after the runtime's tensor-parallel sharding:
heads, KV heads (at least one) and FFN width divided by tp, the hidden size whole; no
collective runs (the cost model adds TP communication). Every block takes and returns
(batch, seq, hidden). Off CUDA, RMSNorm modules are given the memory behaviour of the fused
CUDA kernel (`planner.torch_blocks.RMSNorm`: keep the input and 1/rms), since torch
decomposes rms_norm on a CPU and keeps fp32 copies no GPU run keeps.
"""

from __future__ import annotations

import os
from types import MethodType

import torch
from torch import nn

from planner.errors import PlannerError
from planner.spec import ModelSpec
from planner.torch_blocks import BlockConfig, RMSNorm, TransformerBlock

BLOCKS = ("planner", "torchtitan", "megatron")


def shard_shape(spec: ModelSpec, tp: int, seq: int) -> BlockConfig:
    """The block shapes one of `tp` ranks holds (positions cover `seq`)."""
    return BlockConfig(**spec.block_fields(tp, max(seq, spec.max_position_embeddings)))


def build_transformer(block: str, spec: ModelSpec, tp: int, seq: int, device: str | torch.device) -> nn.Module:
    """One transformer block of `block`'s runtime at the tp-sharded shape, fp32 on `device`,
    taking and returning (batch, seq, hidden)."""
    cfg = shard_shape(spec, tp, seq)
    if block == "planner":
        with torch.device(device):
            return TransformerBlock(cfg)
    if block == "torchtitan":
        return _fused_norms_off_cuda(TorchtitanBlock(cfg, device), device)
    if block == "megatron":
        return _fused_norms_off_cuda(MegatronBlock(cfg, device), device)
    raise PlannerError(f"--block: unknown '{block}'; choose from {', '.join(BLOCKS)}")


def check_block(block: str, spec: ModelSpec, device: str) -> None:
    """PlannerError when `block` cannot run `spec` on `device` (before any measurement)."""
    if block not in BLOCKS:
        raise PlannerError(f"--block: unknown '{block}'; choose from {', '.join(BLOCKS)}")
    if block == "planner":
        return
    llama = (
        spec.norm == "rmsnorm"
        and spec.activation == "swiglu"
        and spec.position_embedding == "rope"
        and not spec.qkv_bias
        and not spec.linear_bias
        and not spec.is_moe
    )
    if block == "torchtitan" and not llama:
        raise PlannerError(
            f"--block torchtitan builds torchtitan's Llama block: {spec.name} is not a "
            "dense Llama-style model (RMSNorm, SwiGLU, RoPE, no biases)"
        )
    if block == "megatron" and (spec.is_moe or spec.position_embedding == "alibi"):
        raise PlannerError(f"--block megatron builds a dense GPT layer: {spec.name} is not one")
    if block == "megatron" and device != "cuda":
        raise PlannerError(
            "--block megatron: megatron-core's local-spec attention (DotProductAttention) "
            "allocates its scores on CUDA, so its forward needs --device cuda"
        )


def _fused_norms_off_cuda(module: nn.Module, device: str | torch.device) -> nn.Module:
    """Give every nn.RMSNorm of `module` the fused kernel's saved tensors when off CUDA."""
    if torch.device(device).type != "cuda":
        for norm in module.modules():
            if isinstance(norm, nn.RMSNorm):
                norm.forward = MethodType(RMSNorm.forward, norm)
    return module


def _import(runtime: str, package: str):
    try:
        return __import__(package, fromlist=["_"])
    except ImportError as exc:
        raise PlannerError(f"--block {runtime} needs {package.split('.')[0]} installed: {exc}") from None


class TorchtitanBlock(nn.Module):
    """torchtitan's Llama3TransformerBlock at one TP rank's shape (see module docstring)."""

    def __init__(self, cfg: BlockConfig, device: str | torch.device):
        super().__init__()
        llama = _import("torchtitan", "torchtitan.models.llama3.model")
        common = _import("torchtitan", "torchtitan.models.common")
        attention = _import("torchtitan", "torchtitan.models.common.attention")
        factories = _import("torchtitan", "torchtitan.models.common.config_utils")
        rope = common.ComplexRoPE.Config(dim=cfg.head_dim, max_seq_len=cfg.max_seq_len, theta=cfg.rope_theta)
        config = llama.Llama3TransformerBlock.Config(
            attention_norm=common.RMSNorm.Config(normalized_shape=cfg.hidden_size, eps=cfg.norm_eps),
            ffn_norm=common.RMSNorm.Config(normalized_shape=cfg.hidden_size, eps=cfg.norm_eps),
            attention=factories.make_gqa_config(
                dim=cfg.hidden_size,
                n_heads=cfg.num_heads,
                n_kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim,
                wqkv_param_init={},
                wo_param_init={},
                rope=rope,
                fuse_qkv=True,
                inner_attention=attention.ScaledDotProductAttention.Config(),
            ),
            feed_forward=factories.make_ffn_config(
                dim=cfg.hidden_size, hidden_dim=cfg.ffn_hidden_size, w1_param_init={}, w2w3_param_init={}
            ),
        )
        with torch.device(device):
            self.block = config.build()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, None, None)

    def _apply(self, fn, recurse=True):
        """Cast parameters only: the complex RoPE cache stays complex64 (torchtitan casts
        parameters through mixed precision, never its buffers)."""
        for param in self.parameters():
            param.data = fn(param.data)
        return self


class MegatronBlock(nn.Module):
    """megatron-core's TransformerLayer from the local (non-TE) GPT spec at one TP rank's
    shape; model-parallel state is initialised with this one process when it is not yet."""

    def __init__(self, cfg: BlockConfig, device: str | torch.device):
        super().__init__()
        specs = _import("megatron", "megatron.core.models.gpt.gpt_layer_specs")
        layer_module = _import("megatron", "megatron.core.transformer.transformer_layer")
        config_module = _import("megatron", "megatron.core.transformer.transformer_config")
        _single_process_model_parallel()
        swiglu = cfg.activation == "swiglu"
        activation = torch.nn.functional.silu if swiglu else torch.nn.functional.gelu
        config = config_module.TransformerConfig(
            num_layers=1,
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_heads,
            num_query_groups=cfg.num_kv_heads,
            kv_channels=cfg.head_dim,
            ffn_hidden_size=cfg.ffn_hidden_size,
            normalization="RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm",
            layernorm_epsilon=cfg.norm_eps,
            gated_linear_unit=swiglu,
            activation_func=activation,
            add_bias_linear=cfg.linear_bias,
            add_qkv_bias=cfg.qkv_bias,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
        )
        spec = specs.get_gpt_layer_local_spec(normalization=config.normalization)
        self.layer = layer_module.TransformerLayer(config, spec.submodules, layer_number=1).to(device)
        self.rope = cfg.position_embedding == "rope"
        self.head_dim, self.rope_theta = cfg.head_dim, cfg.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.transpose(0, 1)  # Megatron runs (seq, batch, hidden)
        rotary = None
        if self.rope:
            seq = hidden.shape[0]
            inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=x.device) / self.head_dim))
            angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
            rotary = torch.cat((angles, angles), dim=-1)[:, None, None, :]
        out, _ = self.layer(hidden, attention_mask=None, rotary_pos_emb=rotary)
        return out.transpose(0, 1)


def _single_process_model_parallel() -> None:
    """Megatron's process groups over this one process (TP = PP = 1), if none exist yet."""
    import torch.distributed as dist

    state = _import("megatron", "megatron.core.parallel_state")
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not state.model_parallel_is_initialized():
        state.initialize_model_parallel(1, 1)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
