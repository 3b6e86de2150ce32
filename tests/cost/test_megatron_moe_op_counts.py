"""The Megatron MoE layer's encoded op counts (planner/presets/megatron_moe_counts.toml) against a
count of Megatron-core's own MoELayer run on CPU (tests/bench/megatron_moe_op_counts.py)."""

import importlib.util

import pytest

from planner.cost.kernel_counts import OpCounts, load_megatron_moe_counts, megatron_moe_block

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not importable", allow_module_level=True)

from tests.bench import megatron_moe_op_counts as script  # noqa: E402


@pytest.fixture(scope="module")
def counted():
    root = script.extract()
    if root is None:
        pytest.skip("no Megatron-LM mirror to take 1e057005 from")
    return script.fixed_and_per_expert(root)


def test_moe_layer_counts_match_megatrons_code(counted):
    encoded = load_megatron_moe_counts()["moe_layer"]
    for direction in ("forward", "backward"):
        for kind in ("kernels", "views", "cpp"):
            assert encoded[f"{direction}_{kind}"] == counted[direction][f"{kind}_fixed"], (direction, kind)
            assert encoded.get(f"{direction}_{kind}_per_expert", 0) == counted[direction][f"{kind}_per_expert"]


def test_deepep_dispatch_is_the_forward_host_sync(counted):
    assert counted["forward"]["syncs"] == ["deepep.dispatch"]
    assert counted["backward"]["syncs"] == []


def test_dense_mlp_replaced_matches_the_trace():
    assert load_megatron_moe_counts()["dense_mlp"] == script.dense_mlp()


def test_block_grows_by_one_gemm_per_local_expert_each_way():
    dense = OpCounts(forward_kernels=28, forward_views=40, backward_kernels=56, backward_views=67)
    few, many = megatron_moe_block(dense, 4), megatron_moe_block(dense, 16)
    assert many.forward_cpp - few.forward_cpp == 2 * 12  # fc1 and fc2
    assert many.backward_cpp - few.backward_cpp == 4 * 12  # their dgrad and wgrad
