"""Collectives: group placement, and the NCCL-shaped model against closed forms written here from
networks.toml's constants and the node datasheets; Megatron-LM's buckets against megatron-core."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib import resources

import pytest

from planner.catalog import resolve_gpu
from planner.cost.comm import Network, grad_bucket_count, group_placement, megatron_bucket_params
from planner.spec import Cluster

NCCL = tomllib.loads(resources.files("planner.presets").joinpath("networks.toml").read_text())["nccl"]
GB = 1e9


# --- placement ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size,stride,per_node",
    [(8, 1, 8), (4, 2, 4), (16, 1, 8), (4, 8, 1), (8, 4, 2), (2, 8, 1), (1, 1, 1)],
)
def test_group_placement(size, stride, per_node):
    assert group_placement(size, stride, 8).per_node == per_node


# --- the NCCL-shaped model -----------------------------------------------------------------


def _net(gpu: str, gpus: int, **overrides) -> Network:
    return Network.of(Cluster.of(resolve_gpu(gpu), gpus, **overrides))


def _launch(gpu: str) -> float:
    return resolve_gpu(gpu).efficiency.kernel_overhead_us * 1e-6


def test_large_intra_node_all_reduce_on_a100_is_a_ring_at_every_nvlink():
    """DGX A100: 12 NVLink 3 links at NCCL's 20 GB/s each; a 4 GiB ring all-reduce with Simple
    costs its latency plus 2(n-1)/n m / 240 GB/s."""
    m, n = 4 * 2**30, 8
    base, hop = NCCL["base_latency_us"]["ring"][2], NCCL["nvlink_latency_us"]["ring"][2]
    expected = _launch("a100-80gb") + (base + 2 * (n - 1) * hop) * 1e-6 + 2 * (n - 1) / n * m / (12 * 20.0 * GB)
    assert _net("a100-80gb", 8).all_reduce(m, n, 1) == pytest.approx(expected)


def test_large_intra_node_all_reduce_on_h100_uses_nvlink_sharp():
    """NVLS: the switch reduces, each GPU's port carries the buffer once each way, at NCCL's
    Hopper nvlsEfficiency of 18 x 20.6 GB/s; faster than any ring."""
    m = 4 * 2**30
    net = _net("h100", 8)
    nvls = _launch("h100") + NCCL["nvlink_latency_us"]["nvls"][2] * 1e-6 + m / (18 * 20.6 * 0.85 * GB)
    assert net.all_reduce(m, 8, 1) == pytest.approx(nvls)
    ring = 2 * 7 / 8 * m / (18 * 20.6 * GB)
    assert net.all_reduce(m, 8, 1) < ring


def test_small_all_reduce_is_latency_bound_by_the_ll_protocol():
    """A few bytes cost the launch plus NCCL's LL latency: ring base + one NVLink hop per step,
    or the tree's base + a chain through the node, whichever is less."""
    n = 8
    ring = NCCL["base_latency_us"]["ring"][0] + 2 * (n - 1) * NCCL["nvlink_latency_us"]["ring"][0]
    tree = NCCL["base_latency_us"]["tree"][0] + 2 * (n - 1) * NCCL["nvlink_latency_us"]["tree"][0]
    t = _net("a100-80gb", 8).all_reduce(64, n, 1)
    assert t == pytest.approx(_launch("a100-80gb") + min(ring, tree) * 1e-6, rel=1e-3)


def test_large_broadcast_in_one_node_is_a_chain_at_every_nvlink():
    """A 1 GB broadcast among 8 H100s (18 NVLink 4 links at NCCL's 20.6 GB/s): Simple's base,
    n steps of the tree's NVLink latency (NCCL charges Simple broadcasts so), the buffer once at
    the ring's bandwidth."""
    m, n = 1e9, 8
    chain = NCCL["base_latency_us"]["ring"][2] + n * NCCL["nvlink_latency_us"]["tree"][2]
    expected = _launch("h100") + chain * 1e-6 + m / (18 * 20.6 * GB)
    assert _net("h100", 8).broadcast(m, n, 1) == pytest.approx(expected)


def test_small_broadcast_latency_grows_by_one_network_link_per_rank():
    """A few bytes over many nodes cost LL's base and one network link per rank of the chain:
    512 more ranks, 512 more of NCCL's LL network latency."""
    net = _net("h100", 1024)
    grown = net.broadcast(8, 1024, 1) - net.broadcast(8, 512, 1)
    assert grown == pytest.approx(512 * NCCL["net_latency_us"]["ring"][0] * 1e-6, rel=1e-6)


def test_small_all_reduce_over_many_nodes_takes_the_tree():
    """512 H100s on 64 nodes, 1 KiB: the tree's latency grows with log2 of the nodes, the ring's
    with every rank, so NCCL runs the tree (LL, capped by the 3+-node LL ceiling, NCCL's
    correction 0.9 at 1 KiB); a large buffer takes NVLS tree, NVLink SHARP in the node and a tree
    over the node's 8 rails, which NCCL models at half their bandwidth beyond 2 nodes."""
    k, nodes, m = 8, 64, 1024
    latency = NCCL["base_latency_us"]["tree"][0] + 2 * (
        (k - 1) * NCCL["nvlink_latency_us"]["tree"][0] + 6 * NCCL["net_latency_us"]["tree"][0]
    )
    algbw = 0.5 * NCCL["ll_max_busbw_many_nodes"]["intel"] * NCCL["tree_correction"][0][4]
    net = _net("h100", k * nodes)
    assert net.all_reduce(m, k * nodes, 1) == pytest.approx(_launch("h100") + (latency + m / (algbw * 1e3)) * 1e-6)
    big = 2**32
    nvls_latency = NCCL["nvlink_latency_us"]["nvls_tree"][2] + 2 * 6 * NCCL["net_latency_us"]["nvls_tree"][2]
    nvls_tree = _launch("h100") + nvls_latency * 1e-6 + big / (0.5 * k * 50.0 * NCCL["nic_fraction"] * GB)
    assert net.all_reduce(big, k * nodes, 1) == pytest.approx(nvls_tree)
    ring = 2 * (k * nodes - 1) / (k * nodes) * big / (18 * 20.6 * GB)  # NVLink < 8 rails x 48 GB/s
    assert net.all_reduce(big, k * nodes, 1) < ring


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100", "b200"])
def test_bus_bandwidth_rises_through_the_protocol_regimes_and_saturates(gpu):
    net = _net(gpu, 8)
    sizes = [2**e for e in range(10, 34)]
    busbw = [2 * 7 / 8 * m / net.all_reduce(m, 8, 1) for m in sizes]
    assert all(b > a for a, b in zip(busbw, busbw[1:]))
    assert busbw[-1] / busbw[-4] < 1.02  # saturated above 1 GiB
    assert busbw[0] < 0.01 * busbw[-1]


def test_dp_group_strided_across_nodes_gets_one_rail():
    """TP 8 fills the node, so each DP group has one GPU per node and all eight groups run at
    once: each uses its own GPU's NIC (rail-optimised), at NCCL's 0.96 of the HDR line rate."""
    m, dp = 2**31, 16
    net = _net("a100-80gb", 8 * dp)
    rail = 25.0 * NCCL["nic_fraction"] * GB
    t = net.reduce_scatter(m, dp, 8)
    assert t == pytest.approx((dp - 1) / dp * m / rail, rel=0.02)
    # half the NIC bandwidth (e.g. 4 NICs for 8 GPUs) doubles a bandwidth-bound call
    halved = _net("a100-80gb", 8 * dp, inter_node_bw_gbps=12.5).reduce_scatter(m, dp, 8)
    assert halved / t == pytest.approx(2.0, rel=0.02)


def test_group_with_k_members_per_node_uses_k_rails():
    """A group with 4 members on each of 4 nodes drives 4 NICs per node."""
    m = 2**31
    net = _net("h100", 32)
    rails = 4 * 50.0 * NCCL["nic_fraction"] * GB
    assert net.all_gather(m, 16, 2) == pytest.approx(15 / 16 * m / rails, rel=0.02)
    assert net.all_gather(m, 16, 2) < net.all_gather(m, 16, 8)


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100"])
@pytest.mark.parametrize("m", [1e3, 1e6, 1e8, 1e10])
def test_spanning_nodes_is_never_faster_than_staying_in_one(gpu, m):
    net = _net(gpu, 64)
    assert net.all_reduce(m, 16, 1) > net.all_reduce(m, 8, 1)
    assert net.all_gather(m, 16, 1) > net.all_gather(m, 8, 1)
    assert net.p2p(m, 2, 8) > net.p2p(m, 2, 1)


def test_all_gather_and_reduce_scatter_cost_the_same_ring():
    net = _net("h100", 8)
    for m in (1e4, 1e7, 1e9):
        assert net.all_gather(m, 8, 1) == net.reduce_scatter(m, 8, 1)
        # an all-gather moves half an all-reduce's ring traffic
        assert net.all_gather(m, 8, 1) < net.all_reduce(m, 8, 1) or m < 1e5


def test_all_to_all_over_two_nodes_sends_half_through_the_rails():
    """16 ranks on 2 nodes: each GPU sends (n-k)/n = 1/2 of its buffer off-node on its own NIC
    (nccl-tests #130: busbw = N/(N-1) x NIC per GPU)."""
    m = 2**32
    t = _net("h100", 16).all_to_all(m, 16, 1)
    assert t == pytest.approx(0.5 * m / (50.0 * NCCL["nic_fraction"] * GB), rel=0.01)


def test_p2p_protocol_by_size_and_link():
    net = _net("h100", 16)
    small = net.p2p(8192, 2, 1)
    ll = NCCL["base_latency_us"]["ring"][0] + NCCL["nvlink_latency_us"]["ring"][0]
    assert small == pytest.approx(_launch("h100") + ll * 1e-6 + 8192 / (141.0 * GB), rel=1e-6)
    big = net.p2p(2**30, 2, 8)  # next PP stage on the next node, over one rail
    assert big == pytest.approx(2**30 / (50.0 * NCCL["nic_fraction"] * GB), rel=0.01)


def test_gpu_without_nccl_fabric_falls_back_to_the_presets_bandwidth():
    gpu = resolve_gpu("mi300x")
    net = _net("mi300x", 8)
    assert net.fabric.nvlink_busbw == pytest.approx(gpu.intra_node_bw_gbps * gpu.efficiency.intra_node_comm)
    assert net.fabric.nvls_efficiency == 0


def test_intra_node_bandwidth_override_scales_the_nvlink():
    base, faster = _net("a100-80gb", 8), _net("a100-80gb", 8, intra_node_bw_gbps=600.0)
    assert faster.fabric.nvlink_busbw == pytest.approx(2 * base.fabric.nvlink_busbw)


def test_comm_efficiency_factors_scale_the_nccl_bandwidths():
    """A calibration lowers intra_node_comm / inter_node_comm: the NVLink and NIC bandwidths of
    NCCL's model scale with them (the presets hold 1.0)."""
    gpu = resolve_gpu("h100")
    assert gpu.efficiency.intra_node_comm == gpu.efficiency.inter_node_comm == 1.0
    slower = gpu.model_copy(
        update={"efficiency": gpu.efficiency.model_copy(update={"intra_node_comm": 0.5, "inter_node_comm": 0.8})}
    )
    base, scaled = _net("h100", 16).fabric, Network.of(Cluster.of(slower, 16)).fabric
    assert scaled.nvlink_busbw == pytest.approx(0.5 * base.nvlink_busbw)
    assert scaled.nic_busbw == pytest.approx(0.8 * base.nic_busbw)


def test_single_member_groups_and_empty_messages_cost_nothing():
    net = _net("h100", 8)
    assert net.all_reduce(1e9, 1, 1) == net.all_gather(0, 8, 1) == 0.0


# --- measured intra-node curves ------------------------------------------------------------


def test_measured_curve_replaces_the_model_inside_one_node_only():
    seen = []

    def table(nbytes: float, size: int) -> float:
        seen.append((nbytes, size))
        return 1e-3 + nbytes / 100e9  # a synthetic node: 1 ms + 100 GB/s

    cluster = Cluster.of(resolve_gpu("h100"), 32)
    measured = Network.of(cluster, measured={"all_reduce": table})
    model = Network.of(cluster)
    assert measured.all_reduce(1e9, 8, 1) == pytest.approx(1e-3 + 1e9 / 100e9)
    assert seen == [(1e9, 8)]
    assert measured.all_reduce(1e9, 16, 1) == model.all_reduce(1e9, 16, 1)  # spans nodes
    assert measured.all_gather(1e9, 8, 1) == model.all_gather(1e9, 8, 1)  # no curve for it
    assert len(seen) == 1


def test_measured_curve_for_an_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="broadcast"):
        Network.of(Cluster.of(resolve_gpu("h100"), 8), measured={"broadcast": lambda b, n: 0.0})


# --- Megatron-LM gradient buckets ----------------------------------------------------------


def test_bucket_size_matches_megatron_core_default():
    """The default in megatron-core's own DistributedDataParallel source."""
    ddp = pytest.importorskip("megatron.core.distributed.distributed_data_parallel")
    match = re.search(r"bucket_size = max\((\d+), (\d+) \* dp_group\.size\(\)\)", inspect.getsource(ddp))
    assert match, "megatron-core's bucket-size default moved"
    floor, per_rank = int(match[1]), int(match[2])
    for dp in (1, 8, 40, 41, 512):
        assert megatron_bucket_params(dp) == max(floor, per_rank * dp)


def test_bucket_count_matches_megatron_core_layout():
    """megatron-core's own bucketing of a stage's parameters (many small tensors)."""
    torch = pytest.importorskip("torch")
    pgb = pytest.importorskip("megatron.core.distributed.param_and_grad_buffer")
    params = [torch.nn.Parameter(torch.empty(1_000_000, device="meta")) for _ in range(300)]
    for dp in (8, 64, 128):
        layout = pgb._compute_default_per_buffer_param_layout(params, megatron_bucket_params(dp))
        assert grad_bucket_count(300e6, dp) == len(layout.bucket_indices)


def test_later_pipeline_ranks_and_no_overlap_use_one_bucket():
    assert grad_bucket_count(1e9, 8, pipeline_rank=0) == 25
    assert grad_bucket_count(1e9, 8, pipeline_rank=1) == 1
    assert grad_bucket_count(1e9, 8, overlap=False) == 1
    assert grad_bucket_count(0, 8) == 0
