"""Context-parallel communication: the ring hidden behind attention, and Llama 3's exposed
all-gather of K and V."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.spec import Cluster

SPEC = resolve_model("llama3-8b")


def _cp_costs(cp_comm: str, seq: int, cp: int, interference: bool = True):
    cluster = Cluster.of(resolve_gpu("h100"), 8)  # CP inside one node (TP 1)
    model = CostModel(SPEC, cluster, CostOptions.of(cp_comm=cp_comm, interference=interference))
    return model, model.layer_costs("transformer", Shard(mbs=1, seq=seq, cp=cp))


def _kv_bytes(seq: int, cp: int) -> float:
    """bf16 K and V of one CP rank's tokens, from the model's head counts."""
    return 2 * 2 * (seq // cp) * SPEC.num_kv_heads * (SPEC.hidden_size // SPEC.num_attention_heads)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_all_gather_cp_exposes_one_gather_and_one_reduce_scatter(cp):
    seq = 65536
    model, costs = _cp_costs("all_gather", seq, cp)
    gathered = _kv_bytes(seq, cp) * cp
    expected = model.network.all_gather(gathered, cp, 1)  # K, V gathered inside the node (TP 1)
    assert costs.comm_forward_s == pytest.approx(expected)
    assert costs.comm_backward_s == pytest.approx(expected)


def test_ring_cp_hides_behind_long_attention_but_not_short():
    _, hidden = _cp_costs("ring", 131072, 8, interference=False)
    assert hidden.comm_forward_s == 0.0  # each step's attention outlasts the K/V hop
    model, long_seq = _cp_costs("ring", 131072, 8)
    # hidden, but its kernels hold SMs: 7 hops each slow the attention by the SM share x hop
    hop = model.network.p2p(_kv_bytes(131072, 8), 8, 1)
    share = resolve_gpu("h100").efficiency.comm_sm_fraction
    assert long_seq.comm_forward_s == pytest.approx(7 * share * hop)
    model, short_seq = _cp_costs("ring", 2048, 8)
    hop = model.network.p2p(_kv_bytes(2048, 8), 8, 1)
    assert 0.0 < short_seq.comm_forward_s < 7 * hop
    _, gathered = _cp_costs("all_gather", 131072, 8)
    assert gathered.comm_forward_s > long_seq.comm_forward_s


def test_unknown_cp_comm_is_refused():
    with pytest.raises(ValueError, match="cp_comm"):
        CostModel(SPEC, Cluster.of(resolve_gpu("h100"), 8), CostOptions.of(cp_comm="a2a"))
