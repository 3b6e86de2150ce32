"""Megatron-LM export, checked by Megatron-LM's own argument parser and validator.

The arguments are read back from the exported `megatron_args.sh` by bash, parsed by
`megatron.training.arguments.parse_args`, checked by `validate_args`, turned into a
`TransformerConfig` (which validates a pipeline layout) and then Megatron's own layer
placement functions must put every layer where the plan does.

megatron-core 0.19 (the release that ships megatron/training) declares Python >= 3.12 and
is installed here from its sdist with --ignore-requires-python; on Python 3.11 it needs one
shim, `typing.override` (3.12) = `typing_extensions.override` (the same decorator).
Patched for a CPU machine, each explained where it is done: the GPU generation query, the
rotary-embedding fusion flag (needs Transformer Engine), and the world size (torchrun's env).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import typing

import pytest
from export_helpers import make_plan, write_files

from planner.export.megatron import export_megatron, pipeline_layout
from planner.schedule.generators import interleave_rounds


@pytest.fixture(scope="module")
def megatron():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (see docs/exporters.md)")
    if not hasattr(typing, "override"):  # Python 3.11: the 3.12 decorator, from its backport
        import typing_extensions

        typing.override = typing_extensions.override
    try:
        arguments = importlib.import_module("megatron.training.arguments")
    except ModuleNotFoundError as exc:  # megatron-core < 0.17 does not ship megatron.training
        pytest.skip(f"megatron.training is not importable: {exc}")
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return arguments, parallel_state, get_num_layers_to_build, get_transformer_layer_offset


def exported_argv(plan_file, tmp_path):
    """Export, then let bash source the arguments file and print MEGATRON_ARGS."""
    folder = write_files(export_megatron(plan_file), tmp_path / "megatron")
    script = f'source "{folder}/megatron_args.sh" && printf "%s\\0" "${{MEGATRON_ARGS[@]}}"'
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    launch = (folder / "launch_megatron.sh").read_text()
    subprocess.run(["bash", "-n", str(folder / "launch_megatron.sh")], check=True)
    return out.rstrip("\0").split("\0"), launch


def megatron_validate(megatron, plan_file, tmp_path, monkeypatch, build_config=True, extra_args=()):
    """Megatron's parse_args + validate_args + TransformerConfig on the exported arguments
    (and `extra_args` after them)."""
    arguments, parallel_state, _, _ = megatron
    argv, launch = exported_argv(plan_file, tmp_path)
    argv = [*argv, *extra_args]
    entry = plan_file.plans[0]
    # torchrun sets RANK / WORLD_SIZE; Megatron derives the data-parallel size from them.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(entry.num_gpus))
    # Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP/CP; the launch script must set it.
    if "export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    else:
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    # No GPU here: report a Hopper GPU (arch 9) as the plans target H100s.
    monkeypatch.setattr(arguments, "get_device_arch_version", lambda: 9)
    import torch  # --moe-grouped-gemm asks the device's compute capability: Hopper's (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    if "--delay-wgrad-compute" in argv:
        # validate_args asks Transformer Engine >= 2.8 for delayed weight gradients with
        # --overlap-grad-reduce, a GPU library not installable here: report that version
        monkeypatch.setattr(arguments, "is_te_min_version", lambda version, *a, **k: version <= "2.8.0")
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    args = arguments.validate_args(arguments.parse_args())
    if not build_config:  # TransformerConfig wants Transformer Engine for FP8, not installable here
        return args, None
    # The fused RoPE kernel comes from Transformer Engine, which does not install on a CPU box.
    args.apply_rope_fusion = False
    config = arguments.core_transformer_config_from_args(args)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(args.virtual_pipeline_model_parallel_size)
    return args, config


def megatron_placement(megatron, config, entry):
    """rank -> [(first layer, end) per chunk] as Megatron-LM would build the model."""
    _, _, num_layers_to_build, layer_offset = megatron
    placement = {}
    for rank in range(entry.pp):
        chunks = []
        for chunk in range(entry.vpp):
            vp_stage = chunk if entry.vpp > 1 else None
            layout = config.pipeline_model_parallel_layout
            if layout is not None:  # Megatron's wrappers do not pass pp_rank on to the layout
                start = layout.get_layer_offset(vp_stage=vp_stage, pp_rank=rank)
                count = layout.get_num_layers_to_build(vp_stage=vp_stage, pp_rank=rank)
            else:
                start = layer_offset(config, vp_stage=vp_stage, pp_rank=rank)
                count = num_layers_to_build(config, vp_stage=vp_stage, pp_rank=rank)
            chunks.append((start, start + count))
        placement[rank] = chunks
    return placement


PLANS = {
    "uneven_first_last": dict(
        model="llama3-8b",
        tp=2,
        pp=4,
        dp=2,
        num_microbatches=8,
        seq=4096,
        sequence_parallel=True,
        stage_layers=[[0, 7], [7, 15], [15, 23], [23, 32]],
        recompute="selective",
    ),
    "even_virtual_stages": dict(
        model="llama3-8b",
        tp=1,
        pp=2,
        dp=1,
        vpp=2,
        num_microbatches=4,
        seq=2048,
        schedule="interleaved_1f1b",
        stage_layers=[[[0, 8], [16, 24]], [[8, 16], [24, 32]]],
    ),
    "arbitrary_virtual_cuts": dict(
        model="llama3-8b",
        tp=2,
        pp=4,
        dp=1,
        vpp=2,
        cp=2,
        num_microbatches=6,
        seq=8192,
        schedule="interleaved_1f1b",
        recompute="full",
        stage_layers=[[[0, 3], [16, 20]], [[3, 7], [20, 24]], [[7, 11], [24, 28]], [[11, 16], [28, 32]]],
    ),
    "arbitrary_cuts_no_vpp": dict(
        model="llama3-8b",
        tp=1,
        pp=3,
        dp=2,
        num_microbatches=6,
        seq=2048,
        zero_stage=0,
        stage_layers=[[0, 9], [9, 22], [22, 32]],
    ),
    "gpt_tied_embeddings": dict(
        model="tiny-gpt", tp=2, pp=2, dp=1, num_microbatches=4, seq=256, dtype="fp16", stage_layers=[[0, 2], [2, 4]]
    ),
    "moe_fsdp_no_pipeline": dict(
        model="mixtral-8x7b", tp=2, pp=1, dp=4, num_microbatches=2, seq=4096, zero_stage=3, stage_layers=[[0, 32]]
    ),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_accepts_and_places_layers_as_planned(name, megatron, tmp_path, monkeypatch):
    fields = dict(PLANS[name])
    plan_file = make_plan(fields.pop("model"), **fields)
    entry = plan_file.plans[0]
    args, config = megatron_validate(megatron, plan_file, tmp_path, monkeypatch)

    assert (
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        args.context_parallel_size,
        args.data_parallel_size,
    ) == (entry.tp, entry.pp, entry.cp, entry.dp)
    assert args.virtual_pipeline_model_parallel_size == (entry.vpp if entry.vpp > 1 else None)
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (
        entry.mbs,
        entry.global_batch,
        entry.seq,
    )
    assert args.sequence_parallel == (entry.sequence_parallel and entry.tp > 1)
    assert args.recompute_granularity == (None if entry.recompute == "none" else entry.recompute)
    spec = plan_file.model
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads) == (
        spec.num_layers,
        spec.hidden_size,
        spec.ffn_hidden_size,
        spec.num_attention_heads,
    )
    assert args.num_query_groups == spec.num_kv_heads or not args.group_query_attention
    assert args.untie_embeddings_and_output_weights == (not spec.tie_embeddings)
    if entry.vpp > 1:  # micro-batches per virtual-stage group: torch's round size (6 for M=6, pp=4)
        assert config.microbatch_group_size_per_vp_stage == interleave_rounds(entry.pp, entry.num_microbatches)[1]
    if entry.pp > 1:
        expected = {rank: list(entry.chunks_of(rank)) for rank in range(entry.pp)}
        assert megatron_placement(megatron, config, entry) == expected


def test_layout_string_parses_in_megatron(megatron):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    sizes = [0, 3, 5, 1]
    layout = PipelineParallelLayerLayout(pipeline_layout(sizes), pipeline_model_parallel_size=2)
    layout.validate_layer_layout(num_layers=sum(sizes), mtp_num_layers=None)
    flat = [t.name for t in layout.flatten_layout]
    assert flat == ["embedding"] + ["decoder"] * 9 + ["loss"]
    assert [layout.layout[r][c].count(layout.flatten_layout[1]) for c in range(2) for r in range(2)] == sizes


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(schedule="gpipe"), "gpipe"),
        (dict(schedule="zbv", vpp=2, stage_layers=[[[0, 1], [3, 4]], [[1, 2], [2, 3]]]), "zbv"),
        (dict(schedule="zb_h1"), "zb_h1"),
        (dict(zero_stage=3), "ZeRO-3"),
        (dict(recompute=["full", "none"]), "recompute differs"),
    ],
)
def test_megatron_refuses_what_it_cannot_run(fields, words):
    from planner.errors import ExportError

    with pytest.raises(ExportError, match=words):
        export_megatron(make_plan(**fields))


def test_megatron_refuses_alibi_models():
    from planner.errors import ExportError

    with pytest.raises(ExportError, match="ALiBi"):
        export_megatron(make_plan("bloom-176b", stage_layers=[[0, 35], [35, 70]]))


MOE_PLANS = {
    "deepseek_v3_ep_mla_mtp": dict(
        model="deepseek-v3",
        tp=2,
        pp=1,
        dp=32,
        ep=16,
        etp=1,
        num_microbatches=2,
        seq=4096,
        sequence_parallel=True,
        stage_layers=[[0, 61]],
    ),
    "mixtral_ep_etp": dict(
        model="mixtral-8x7b",
        tp=4,
        pp=2,
        dp=4,
        ep=4,
        etp=2,
        num_microbatches=8,
        seq=4096,
        sequence_parallel=True,
        stage_layers=[[0, 16], [16, 32]],
    ),
    "qwen3_ep_across_dp": dict(
        model="qwen3-30b-a3b",
        tp=1,
        pp=2,
        dp=16,
        ep=8,
        etp=1,
        num_microbatches=4,
        seq=4096,
        stage_layers=[[0, 24], [24, 48]],
    ),
}


@pytest.mark.parametrize("name", sorted(MOE_PLANS))
def test_megatron_accepts_moe_plans(name, megatron, tmp_path, monkeypatch):
    fields = dict(MOE_PLANS[name])
    plan_file = make_plan(fields.pop("model"), **fields)
    entry, spec = plan_file.plans[0], plan_file.model
    args, config = megatron_validate(megatron, plan_file, tmp_path, monkeypatch)
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (entry.ep, entry.etp)
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size) == (
        spec.num_experts,
        spec.moe_top_k,
        spec.expert_ffn_hidden_size,
    )
    assert args.moe_grouped_gemm and args.moe_token_dispatcher_type == "alltoall"
    # Megatron's own layer pattern: MoE exactly where the spec says
    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else [1] * spec.num_layers
    assert pattern == [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]
    if spec.is_mla:
        assert config.multi_latent_attention and (config.q_lora_rank, config.kv_lora_rank) == (1536, 512)
        assert (config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim) == (128, 64, 128)
        assert config.mtp_num_layers == 1
        assert config.moe_shared_expert_intermediate_size == 2048


def test_megatron_accepts_fp8_moe_arguments(megatron, tmp_path, monkeypatch):
    plan_file = make_plan(
        "mixtral-8x7b",
        tp=2,
        pp=1,
        dp=4,
        ep=4,
        etp=1,
        num_microbatches=2,
        seq=4096,
        sequence_parallel=True,
        stage_layers=[[0, 32]],
        precision="fp8",
    )
    args, _ = megatron_validate(megatron, plan_file, tmp_path, monkeypatch, build_config=False)
    assert args.fp8 == "hybrid" and args.bf16 and args.expert_model_parallel_size == 4


def test_megatron_lm_training_script_overlaps_interleaved_p2p_by_default(megatron):
    """Megatron-LM's own parser: `--no-overlap-p2p-communication` is store_false, so its training
    script overlaps the interleaved schedule's exchange unless told not to, what the cost model's
    "megatron-lm" p2p mode charges for interleaved plans (tests/cost/test_blocking_p2p.py)."""
    import argparse

    arguments = megatron[0]
    parser = arguments._add_distributed_args(argparse.ArgumentParser())
    assert parser.parse_args([]).overlap_p2p_comm is True
    assert parser.parse_args(["--no-overlap-p2p-communication"]).overlap_p2p_comm is False


# --moe-dispatcher deepep and --moe-ep-overlap (the cost options a plan records it was priced with)

OVERLAP_LAYOUT = dict(
    model="qwen3-30b-a3b",
    tp=2,
    pp=2,
    vpp=2,
    dp=8,
    ep=8,
    etp=1,
    num_microbatches=4,
    seq=4096,
    sequence_parallel=True,
    schedule="interleaved_1f1b",
    stage_layers=[[[0, 12], [24, 36]], [[12, 24], [36, 48]]],
    recompute="selective",
)


def test_megatron_runs_deepep_plans_through_its_flex_dispatcher(megatron, tmp_path, monkeypatch):
    fields = dict(MOE_PLANS["qwen3_ep_across_dp"])
    plan_file = make_plan(fields.pop("model"), moe_dispatcher="deepep", **fields)
    args, config = megatron_validate(megatron, plan_file, tmp_path, monkeypatch)
    assert args.moe_token_dispatcher_type == "flex" and config.moe_flex_dispatcher_backend == "deepep"
    assert not args.moe_enable_deepep  # the deprecated spelling is not used
    _, launch = exported_argv(plan_file, tmp_path / "again")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in launch


def test_megatron_refuses_deepep_for_a_capacity_capped_model():
    from planner.errors import ExportError

    fields = dict(MOE_PLANS["qwen3_ep_across_dp"])
    plan_file = make_plan(fields.pop("model"), moe_dispatcher="deepep", **fields)
    capped = plan_file.model_copy(update={"model": plan_file.model.model_copy(update={"moe_capacity_factor": 1.25})})
    with pytest.raises(ExportError, match="DeepEP's token dispatcher.*pad_expert_input_to_capacity"):
        export_megatron(capped)


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_megatron_runs_the_overlap_the_plan_was_priced_with(dispatcher, megatron, tmp_path, monkeypatch):
    plan_file = make_plan(**OVERLAP_LAYOUT, moe_dispatcher=dispatcher, moe_ep_overlap=True)
    args, config = megatron_validate(megatron, plan_file, tmp_path, monkeypatch)
    assert config.overlap_moe_expert_parallel_comm and config.delay_wgrad_compute
    assert args.virtual_pipeline_model_parallel_size == 2 and args.expert_model_parallel_size == 8
    _, launch = exported_argv(plan_file, tmp_path / "again")
    # TP 2 with the overlap: Megatron warns instead of asserting CUDA_DEVICE_MAX_CONNECTIONS=1
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in launch


GATE_CASES = {  # layout change -> Megatron's own refusal of the overlap (None: it runs it)
    "interleaved": (dict(), None),
    "no_pipeline": (dict(pp=1, vpp=1, dp=16, schedule="1f1b", stage_layers=[[0, 48]]), None),
    "plain_1f1b_with_pipeline": (
        dict(vpp=1, schedule="1f1b", stage_layers=[[0, 24], [24, 48]]),
        "virtual_pipeline_model_parallel_size must be specified",
    ),
    "no_expert_parallelism": (dict(ep=1), "only supported with expert model parallelism"),
    "full_recompute": (dict(recompute="full"), "disable full recomputation"),
    "two_mtp_layers": (dict(mtp_depth=2), "MTP supports at most one layer"),
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_the_overlap_gate_is_megatrons_own(case, megatron, tmp_path, monkeypatch):
    """Where the planner prices the combined-1F1B overlap (`runs_combined_1f1b`), Megatron's
    validate_args and TransformerConfig accept --overlap-moe-expert-parallel-comm
    --delay-wgrad-compute on that layout; where it does not, they refuse them, and the exporter
    refuses a plan that claims it."""
    from planner.cost.model import CostOptions
    from planner.errors import ExportError
    from planner.layout import layout_from_entry
    from planner.predict import runs_combined_1f1b

    change, megatron_refusal = GATE_CASES[case]
    fields = OVERLAP_LAYOUT | change
    mtp = fields.pop("mtp_depth", None)
    plan_file = make_plan(**fields)
    if mtp is not None:  # Qwen3 with two MTP layers (Megatron's --mtp-num-layers)
        plan_file = plan_file.model_copy(update={"model": plan_file.model.model_copy(update={"mtp_depth": mtp})})
    entry, spec = plan_file.plans[0], plan_file.model
    priced = runs_combined_1f1b(CostOptions.of(moe_ep_overlap=True), spec, layout_from_entry(entry))
    overlap = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if priced:
        _, config = megatron_validate(megatron, plan_file, tmp_path, monkeypatch, extra_args=overlap)
        assert config.overlap_moe_expert_parallel_comm
        claimed = plan_file.model_copy(update={"plans": [entry.model_copy(update={"moe_ep_overlap": True})]})
        assert "--overlap-moe-expert-parallel-comm" in exported_argv(claimed, tmp_path / "claimed")[0]
    else:
        with pytest.raises((AssertionError, ValueError), match=megatron_refusal):
            megatron_validate(megatron, plan_file, tmp_path, monkeypatch, extra_args=overlap)
        claimed = plan_file.model_copy(update={"plans": [entry.model_copy(update={"moe_ep_overlap": True})]})
        with pytest.raises(ExportError, match="combined-1F1B all-to-all overlap"):
            export_megatron(claimed)
    assert priced == (megatron_refusal is None)
