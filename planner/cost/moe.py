"""The mixture-of-experts terms of a block beside its GEMMs (planner/cost/shapes.py
`moe_gemms`): the busiest expert-parallel rank's load, and the all-to-all that dispatches
tokens to their experts and combines them back.

Megatron-Core's MoE parallel folding (Liu et al. 2025, "MoE Parallel Folding") lays the
attention's TP x CP x DP ranks and the experts' ETP x EP x EDP ranks over the same GPUs. The
token dispatcher ("alltoall") sends each token's top-k copies from the GPU that holds it
(with sequence parallelism its 1/TP of the micro-batch's tokens) to the EP rank holding the
chosen expert, all-gathers them over the ETP group that splits that expert's FFN, and
reverses both after the expert MLP (the combine). On one GPU:

    tokens entering the MoE layer   t = mbs * seq / (cp * tp)
    routed copies it sends          t * k           (k = top-k)
    local experts                   E / EP, each split ETP ways
    tokens per local expert         m = t * k * EP * ETP / E  (x the load imbalance)

so the expert FLOPs per GPU, E/EP x 2 m (3 h f / ETP), are t k 6 h f whatever EP and ETP:
EP and ETP change the grouped GEMM's shape (small m runs slower: the GEMM efficiency curve of
planner/cost/compute.py at that m), the all-to-all volume and where it runs, and the expert
weights per GPU; not the work.

The busiest EP rank sets the pace (every rank waits for it in the combine): its tokens are
`imbalance` x the mean. With a capacity factor (token dropping) the busiest rank is capped at
that factor; dropless routing takes `CostOptions.moe_imbalance`.
"""

from __future__ import annotations

from math import comb
from typing import Literal, get_args

from planner.cost.shapes import Shard, expert_tp
from planner.spec import ModelSpec

FEPLB_IDLE_SHARE = 0.186
"""FEPLB (Qi, Liu, Zhao 2026, arXiv 2604.19654), Figure 1(b) as its review quotes it: on GLM-5's
MoE layers (128 routed experts, EP 8, no auxiliary loss, up to 16 H100s, training, per
micro-batch) "18.6% of GPU time per MoE layer is lost" waiting for the busiest EP rank."""

DEFAULT_IMBALANCE = 1 / (1 - FEPLB_IDLE_SHARE)
"""Busiest EP rank's tokens over the mean, dropless routing: 1.229, from the one published
per-micro-batch, per-EP-rank training measurement found, FEPLB's (`FEPLB_IDLE_SHARE`). In a
synchronous layer the GPU time lost is the ranks' idle share, 1 - mean / max, so max / mean =
1 / (1 - 0.186). The paper's own definition was not readable here: read instead as
max / mean - 1 it would be 1.186 (3.5% lower). It is GEMM time, which tracks tokens at these
sizes, measured without an auxiliary loss: a run whose router balances harder (aux loss,
DeepSeek's bias) may sit lower. Cross-check: Switch Transformer's capacity factor (Fedus et al.
2022, JMLR, Table 1: 1.25, the per-expert head-room that dropped few tokens under its
load-balancing loss), is within 2%. Other sources checked (docs/moe.md), none a
per-step, per-rank figure:

* Wang et al. 2024 (arXiv 2408.15664), Table 2, as two third-party notes on its HTML quote it
  (the paper itself was not readable here): MaxVio_global = max load / mean load - 1, per
  expert, over the whole validation set, 64 routed experts, top-6: 0.72 (1B) and 0.52 (3B)
  with an auxiliary loss, 0.04 and 0.04 aux-loss-free. A rank's load sums
  its E / EP experts, so per expert bounds per rank (1.04 to 1.72 as max / mean) only at that
  aggregation; one training batch is further off the mean (their Figure 3, MaxVio_batch, whose
  values no readable source quotes), so these are not per-step figures.
* DeepSeek-V3 (arXiv 2412.19437, section 4.5.3, read from its LaTeX source): Figure 9 plots
  16B models' relative expert load per Pile domain (a heatmap, no per-batch or per-rank
  max / mean); the text says small-batch imbalance "is naturally addressed by our training
  framework that uses large-scale expert parallelism and data parallelism, which guarantees a
  large size of each micro-batch" - qualitative.
* UltraEP (arXiv 2606.04101, withdrawn in v2): "inter-rank imbalance" 1.30 to 4.01 without
  balancing, 106B to 671B models, training and prefill together: no per-run figure.
* DODOCO (arXiv 2605.20982): per-expert max / mean from inference checkpoints; finds it moves
  at most 5% from EP 4 to 32. Inference, and the excerpt read gives no value.
* Megatron MoE ModelZoo: forced-balance vs dropless throughput (295 vs 237 TFLOP/s, Qwen3-235B
  at 16K), a whole-step figure.

`--moe-imbalance` (CostOptions.moe_imbalance) sets what a run's router statistics show."""


def tokens_per_gpu(shard: Shard) -> float:
    """Tokens entering the MoE layer on one GPU (the micro-batch split over CP and, with
    Megatron's sequence-parallel MoE, TP)."""
    return shard.local_tokens / shard.tp


def imbalance_of(spec: ModelSpec, shard: Shard, dropless_imbalance: float) -> float:
    """Busiest EP rank's tokens over the mean: 1 when one rank holds every expert, the
    capacity factor with token dropping, else the dropless figure."""
    if shard.ep == 1:
        return 1.0
    return spec.moe_capacity_factor if spec.moe_capacity_factor is not None else dropless_imbalance


def dispatch_bytes(spec: ModelSpec, shard: Shard, dtype_bytes: int) -> float:
    """Bytes one GPU sends in one dispatch (and receives back in the combine): its tokens'
    top-k copies of the hidden state."""
    return tokens_per_gpu(shard) * spec.moe_top_k * spec.hidden_size * dtype_bytes


MoeDispatcher = Literal["alltoall", "deepep"]
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)

DEEPEP_NVLINK_FRACTION = (153.0 / 164.8, 158.0 / 164.8)
"""DeepEP's intranode normal kernels (dispatch, combine) as a share of the NVLink's bus
bandwidth: DeepEP README (deepseek-ai/DeepEP, commit 567632d, 2026-02-03, "Normal kernels with
NVLink and RDMA forwarding"), H800, EP 8: 153 GB/s dispatch, 158 GB/s combine, over the H800's
NVLink as planner/presets/networks.toml has it (8 links x 20.6 GB/s = 164.8). The bytes are what
a rank receives (tests/test_internode.py and test_intranode.py: `recv_x.numel() * 2`, one copy
per token and destination rank). Cross-check: 337 GB/s measured by test_intranode.py on an
18-link H20 (DeepEP issue #16), 0.91 of 18 x 20.6 against 0.93 here."""

DEEPEP_RDMA_GBPS = {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
"""DeepEP's internode normal kernels' RDMA "bottleneck bandwidth" (dispatch, combine) in GB/s
per GPU by EP size, same README table: H800, one CX7 400 Gb/s NIC per GPU (~50 GB/s), 4096
tokens, hidden 7168, top-8. The bytes are "logical": one copy per token and destination *node*,
the token's own node included (test_internode.py: `num_rdma_token_sent * hidden * 2`,
`rdma_idx = topk_idx // (num_experts // num_nodes)` made unique per token), which is why 58
exceeds the NIC's 50. Sizes outside the table take the nearest measured one."""

DEEPEP_NIC_GBPS = 50.0 * 0.96
"""The NIC the RDMA table was measured on, as the planner's fabric sees a 50 GB/s NIC
(`nic_fraction` 0.96 of networks.toml): the table scales by a cluster's NIC over this."""

DEEPEP_NUM_SMS = 20
"""SMs DeepEP's normal dispatch and combine kernels hold while they run: `Buffer.num_sms = 20`
(deepseek-ai/DeepEP deep_ep/buffer.py, the class default; 10 channels of 2 SMs, a sender and a
forwarder), which Megatron-core 0.19.2 keeps (`moe_flex_dispatcher_num_sms` None: "each backend
uses its own default"; the deprecated `moe_deepep_num_sms` says "historical default 20"). The
same 20 of 132 that DeepSeek-V3's report gives for its dispatch and combine (section 3.2.1).
Beside compute they leave it the rest: 20 / sm_count of the GPU, not NCCL's
`comm_sm_fraction`."""


def deepep_sm_fraction(sm_count: int | None) -> float | None:
    """Share of a GPU's SMs DeepEP's normal kernels take from the compute beside them; None
    where the GPU's SM count is not given."""
    return DEEPEP_NUM_SMS / sm_count if sm_count else None


def expected_groups_hit(num_experts: int, top_k: int, groups: int) -> float:
    """Mean number of the `groups` equal groups of experts (ranks, nodes) one token's top-k
    distinct experts fall in, routing uniform over the experts (DeepEP's benchmark draws random
    scores): groups x (1 - C(E - E/groups, k) / C(E, k))."""
    if groups <= 1:
        return 1.0
    per_group = num_experts // groups
    missed = comb(num_experts - per_group, top_k) / comb(num_experts, top_k)
    return groups * (1.0 - missed)


def deepep_times(
    spec: ModelSpec,
    shard: Shard,
    dtype_bytes: int,
    imbalance: float,
    gpus_per_node: int,
    nvlink_busbw: float,
    nic_busbw: float,
) -> tuple[float, float]:
    """Seconds of one DeepEP normal-kernel dispatch and one combine on the busiest rank
    (Megatron's `--moe-token-dispatcher-type flex --moe-enable-deepep`): each token goes once to
    each node (across nodes, RDMA then NVLink forwarding) or rank (inside one node) holding one
    of its experts, at DeepEP's measured bandwidths above."""
    ep = shard.ep
    etp = expert_tp(shard)
    token_bytes = tokens_per_gpu(shard) * spec.hidden_size * dtype_bytes * imbalance
    ranks_per_node = max(1, gpus_per_node // etp)
    if ep <= ranks_per_node:
        copies = expected_groups_hit(spec.num_experts, spec.moe_top_k, ep)
        dispatch, combine = (nvlink_busbw * f for f in DEEPEP_NVLINK_FRACTION)
    else:
        copies = expected_groups_hit(spec.num_experts, spec.moe_top_k, ep // ranks_per_node)
        nearest = min(DEEPEP_RDMA_GBPS, key=lambda size: abs(size - ep))
        dispatch, combine = (bw * nic_busbw / DEEPEP_NIC_GBPS for bw in DEEPEP_RDMA_GBPS[nearest])
    moved = token_bytes * copies
    return moved / (dispatch * 1e9), moved / (combine * 1e9)
