"""MoE costs against closed forms: the all-to-all within its link bounds, expert FLOPs conserved
over EP and ETP, the grouped GEMM slowing as tokens per expert shrink, the imbalance on the
busiest rank, DualPipeV hiding the all-to-all, fp8 GEMMs at the fp8 peak."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.comm import Network
from planner.cost.compute import AnalyticCompute
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard, layer_work, moe_gemms
from planner.spec import Cluster

H100 = resolve_gpu("h100")
NET = Network.of(Cluster.of(H100, 64))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_inside_a_node_is_bounded_by_nvlink(n):
    """The exact NCCL-modelled times are tests/cost/test_comm.py's; here the bytes each rank
    sends to its n - 1 peers never beat the GPU's NVLink rate, and more bytes take longer."""
    m = 64e6
    t = NET.all_to_all(m, n, 1)
    assert t >= (n - 1) / n * m / (H100.intra_node_bw_gbps * 1e9)
    assert NET.all_to_all(2 * m, n, 1) > t


def test_all_to_all_across_nodes_is_bounded_by_the_share_leaving_the_node():
    m, n = 64e6, 32  # 4 nodes of 8: 24/32 of the bytes leave the node over the NIC
    assert NET.all_to_all(m, n, 1) >= 24 / 32 * m / (H100.inter_node_bw_gbps * 1e9)
    assert NET.all_to_all(m, n, 1) > NET.all_to_all(m, 8, 1)
    assert NET.all_to_all(m, 1, 1) == 0.0


@pytest.mark.parametrize(("tp", "ep", "etp"), [(1, 1, 1), (2, 8, 1), (4, 4, 2), (2, 1, 2), (8, 128, 1)])
def test_expert_flops_per_gpu_do_not_depend_on_ep_or_etp(tp, ep, etp):
    spec = resolve_model("qwen3-30b-a3b")
    shard = Shard(mbs=2, seq=4096, tp=tp, sequence_parallel=tp > 1, ep=ep, etp=etp)
    experts = [g for g in moe_gemms(spec, shard) if g.name.startswith("expert")]
    # t k 6 h f / tp: every token's top-k expert MLPs, split over the TP group's GPUs
    assert sum(g.flops for g in experts) == pytest.approx(2 * 4096 * 8 * 3 * 2 * 2048 * 768 / tp)
    assert all(g.count == 128 // ep for g in experts)


def test_grouped_gemm_slows_as_tokens_per_expert_shrink():
    spec = resolve_model("deepseek-v3")
    compute = AnalyticCompute(resolve_gpu("h100"))

    def expert_time(ep: int) -> float:
        shard = Shard(mbs=1, seq=4096, ep=ep, etp=1)
        return sum(
            g.count * compute.gemm_time(g.m, g.n, g.k) for g in moe_gemms(spec, shard) if g.name.startswith("expert")
        )

    # same FLOPs, fewer and fatter GEMMs per GPU as EP grows: 128 tokens per expert at EP 1
    assert expert_time(1) > expert_time(8) > expert_time(64) > 0


def test_imbalance_scales_the_busiest_ranks_expert_work_and_dispatch():
    spec = resolve_model("mixtral-8x7b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    shard = Shard(mbs=1, seq=4096, ep=8, etp=1)
    even = CostModel(spec, cluster, CostOptions.of(moe_imbalance=1.0)).layer_costs("transformer", shard)
    skewed = CostModel(spec, cluster, CostOptions.of(moe_imbalance=1.5)).layer_costs("transformer", shard)
    # dispatch + combine, each way: the busiest rank sends 1.5x the even share of the tokens
    from planner.cost.moe import dispatch_bytes

    net = CostModel(spec, cluster).network
    sent = dispatch_bytes(spec, shard, 2)
    assert even.moe_comm_s == pytest.approx(4 * net.all_to_all(sent, 8, 1))
    assert skewed.moe_comm_s == pytest.approx(4 * net.all_to_all(1.5 * sent, 8, 1))
    assert skewed.forward_s > even.forward_s
    one_rank = Shard(mbs=1, seq=4096, ep=1, etp=1)  # every expert on one rank: no straggler
    assert CostModel(spec, cluster, CostOptions.of(moe_imbalance=1.5)).layer_costs(
        "transformer", one_rank
    ) == CostModel(spec, cluster, CostOptions.of(moe_imbalance=1.0)).layer_costs("transformer", one_rank)


def test_dualpipev_pairing_hides_the_all_to_all():
    spec = resolve_model("deepseek-v3")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 2048))
    shard = Shard(mbs=1, seq=4096, ep=64, etp=1)
    exposed = model.layer_costs("transformer", shard, "none")
    paired = model.layer_costs("transformer", shard, "none", True)
    assert exposed.moe_comm_s > 0
    assert paired.moe_comm_s < exposed.moe_comm_s
    assert paired.forward_s == exposed.forward_s and paired.backward_s == exposed.backward_s
    dense = resolve_model("llama3-8b")
    assert (
        CostModel(dense, Cluster.of(resolve_gpu("h100"), 8))
        .layer_costs("transformer", Shard(mbs=1, seq=4096))
        .moe_comm_s
        == 0.0
    )


def test_fp8_runs_large_gemms_at_the_fp8_peak_and_attention_at_bf16():
    gpu = resolve_gpu("h100")
    bf16, fp8 = AnalyticCompute(gpu), AnalyticCompute(gpu, gemm_dtype="fp8")
    big = (16384, 16384, 16384)
    # the measured GEMM table is bf16: fp8 GEMMs keep gemm x the fp8 peak, as bf16 ones do without the table
    formula = AnalyticCompute(gpu, efficiency=gpu.efficiency.model_copy(update={"gemm_table": None}))
    ratio = (formula.gemm_time(*big) - formula.overhead_s) / (fp8.gemm_time(*big) - fp8.overhead_s)
    assert ratio == pytest.approx(gpu.peak_tflops["fp8"] / gpu.peak_tflops["bf16"])
    assert fp8.gemm_time(*big) < bf16.gemm_time(*big)
    assert bf16.attention_time(1e12, 4096, False) == fp8.attention_time(1e12, 4096, False)
    spec = resolve_model("llama3-8b")
    work = layer_work(spec, "transformer", Shard(mbs=1, seq=4096))
    assert fp8.layer_times(work).forward_s < bf16.layer_times(work).forward_s


def test_mla_attention_core_uses_its_head_dims():
    spec = resolve_model("deepseek-v3")
    work = layer_work(spec, "transformer", Shard(mbs=1, seq=4096))
    # QK^T over 192 and AV over 128 per head, causal half: 2 b s^2 a (192 + 128) / 2
    assert work.attention_flops == 2 * 4096**2 * 128 * (192 + 128) / 2
