"""torchtitan export, checked by torchtitan 0.3: its ConfigManager loads the recipe (and
re-validates `Trainer.Config`), the model config validates itself against the parallelism
(`update_from_config`), `ParallelDims` accepts the degrees for the plan's world size, the
model built on the meta device has the planned parameter count, and torchtitan's own stage
placement and module split give every rank the planned layers; the schedule CSV agrees.
Mixtures of experts also build torchtitan's device meshes (a fake process group of the plan's
world size) with the planned expert-parallel degree, put experts on the planned layers,
initialise, and route like the exported torch script's MoE layer."""

from __future__ import annotations

import sys

import pytest
from export_helpers import make_plan, write_files

from planner.catalog import resolve_model
from planner.errors import ExportError
from planner.export.torchtitan import export_torchtitan
from planner.schedule.registry import virtual_stage

pytest.importorskip("torchtitan", reason="torchtitan not installed (see docs/exporters.md)")
torch = pytest.importorskip("torch")


def per_rank(cuts: list[int], pp: int, vpp: int, schedule: str) -> list:
    """stage_layers (per rank, per chunk) for model-order cut points `cuts` (stage ends)."""
    starts = [0] + cuts[:-1]
    ranks = [[None] * vpp for _ in range(pp)]
    for rank in range(pp):
        for chunk in range(vpp):
            stage = virtual_stage(rank, chunk, pp, schedule)
            ranks[rank][chunk] = [starts[stage], cuts[stage]]
    return ranks if vpp > 1 else [r[0] for r in ranks]


PLANS = {
    "zbv_tp_fsdp": (
        "llama3-8b",
        dict(
            tp=2,
            pp=4,
            dp=2,
            vpp=2,
            schedule="zbv",
            num_microbatches=8,
            seq=4096,
            sequence_parallel=True,
            recompute="full",
            stage_layers=per_rank([4, 8, 12, 16, 20, 24, 28, 32], 4, 2, "zbv"),
        ),
    ),
    "interleaved_uneven": (
        "llama3-8b",
        dict(
            pp=4,
            dp=2,
            vpp=2,
            schedule="interleaved_1f1b",
            num_microbatches=8,
            stage_layers=per_rank([3, 7, 11, 15, 19, 23, 27, 32], 4, 2, "interleaved_1f1b"),
            zero_stage=3,
        ),
    ),
    "zb_h2_from_csv": ("tiny-llama", dict(pp=2, schedule="zb_h2", dtype="fp32")),
    "no_pipeline_ddp": (
        "tiny-llama",
        dict(pp=1, dp=8, num_microbatches=4, stage_layers=[[0, 4]], zero_stage=0, recompute="selective"),
    ),
    "context_parallel": (
        "llama3-70b",
        dict(tp=8, cp=2, pp=1, dp=4, num_microbatches=2, seq=8192, stage_layers=[[0, 80]]),
    ),
}
MOE_PLANS = {
    "moe_ep_pipeline": ("tiny-moe", dict(dp=2, ep=2, pp=2, stage_layers=[[0, 2], [2, 6]])),
    "moe_tp_experts_no_ep": ("tiny-moe", dict(tp=2, dp=2, pp=1, num_microbatches=2, stage_layers=[[0, 6]])),
    "mixtral_ep_over_fsdp_and_tp": (
        "mixtral-8x7b",
        dict(tp=2, dp=4, ep=8, etp=1, pp=1, num_microbatches=2, seq=4096, stage_layers=[[0, 32]]),
    ),
    "qwen3_moe_ddp_ep_over_tp": (
        "qwen3-30b-a3b",
        dict(tp=4, dp=2, ep=4, etp=1, pp=2, zero_stage=0, seq=4096, stage_layers=[[0, 24], [24, 48]]),
    ),
    "deepseek_v3_mla_mtp_ep64": (
        "deepseek-v3",
        dict(tp=8, dp=8, ep=64, etp=1, pp=1, num_microbatches=2, seq=4096, stage_layers=[[0, 61]]),
    ),
}
"""Mixture-of-experts plans; those with GQA also run the placement test above."""
PLANS |= {name: plan for name, plan in MOE_PLANS.items() if "deepseek" not in name}


def tiny_mla(plan_file):
    """`plan_file` with tiny-moe given DeepSeek-style latent attention and one MTP layer."""
    model = plan_file.model.model_copy(
        update=dict(
            name="tiny-mla",
            q_lora_rank=64,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            qk_nope_head_dim=32,
            v_head_dim=32,
            mtp_depth=1,
        )
    )
    return plan_file.model_copy(update={"model": model})


@pytest.fixture
def load_recipe(tmp_path, monkeypatch):
    """Export a plan and load it the way `torchtitan.train` does (module path + function)."""
    from torchtitan.config import ConfigManager

    def load(plan_file):
        folder = write_files(export_torchtitan(plan_file), tmp_path / "titan")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.chdir(folder)
        sys.modules.pop("planner_recipe", None)
        return folder, ConfigManager().parse_args(["--module", "planner_recipe", "--config", "planner_plan"])

    return load


def planner_param_count(spec) -> int:
    from planner.export.torch_pp import moe_block_fields
    from planner.torch_blocks import BlockConfig, Transformer

    with torch.device("meta"):
        model = Transformer(BlockConfig(**spec.block_fields(), **moe_block_fields(spec)))
        return sum(p.numel() for p in model.parameters())


@pytest.fixture
def fake_world():
    """A fake process group of `size` ranks in this process (torch's fake backend), in which
    torchtitan builds its device meshes without devices."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(size: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_loads_and_places_layers_as_planned(name, load_recipe):
    from torch.distributed.pipelining.schedules import _Action
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping, _split_module

    model, fields = PLANS[name]
    plan_file = make_plan(model, **fields)
    entry, spec = plan_file.plans[0], plan_file.model
    folder, config = load_recipe(plan_file)

    config.model_spec.model.update_from_config(config=config)  # torchtitan's own model/parallel checks
    dims = ParallelDims.from_config(config.parallelism, world_size=entry.num_gpus)
    assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp, dims.ep) == (
        entry.dp,
        entry.tp,
        entry.pp,
        entry.cp,
        entry.ep,
    )
    assert config.training.seq_len == entry.seq
    assert config.training.global_batch_size == entry.global_batch
    with torch.device("meta"):
        built = config.model_spec.model.build()
    assert sum(p.numel() for p in built.parameters()) == planner_param_count(spec)

    if entry.pp == 1:
        return
    parallelism = config.parallelism
    assert config.training.local_batch_size // parallelism.pipeline_parallel_microbatch_size == entry.num_microbatches
    names = parallelism.module_fqns_per_model_part
    csv_rows = (folder / parallelism.pipeline_parallel_schedule_csv).read_text().splitlines()
    for rank in range(entry.pp):
        stages = _get_pp_rank_to_stage_indices_mapping(
            rank, entry.pp, parallelism.pipeline_parallel_schedule, len(names)
        )
        held = []
        for stage in stages:
            layers = [int(k) for k in _split_module(built, names[stage]).layers]
            held.append((min(layers), max(layers) + 1))
        assert held == list(entry.chunks_of(rank))
        assert {_Action.from_str(a).stage_index for a in csv_rows[rank].split(",")} == set(stages)


def test_torchtitan_recipe_records_provenance(load_recipe):
    folder, _ = load_recipe(make_plan("tiny-llama", pp=2))
    text = (folder / "planner_recipe.py").read_text()
    assert "# planner 0.1.0, costs: analytic" in text and "# predicted: step 1.25 s" in text
    assert "predicted" in (folder / "PLANNER_PROVENANCE.md").read_text()


def test_torchtitan_refuses():
    with pytest.raises(ExportError, match="not a Llama-style"):
        export_torchtitan(make_plan("tiny-gpt"))
    tied = make_plan("tiny-llama")
    tied = tied.model_copy(update={"model": tied.model.model_copy(update={"tie_embeddings": True})})
    with pytest.raises(ExportError, match="weight tying under PP"):
        export_torchtitan(tied)
    with pytest.raises(ExportError, match="recompute differs"):
        export_torchtitan(make_plan("tiny-llama", recompute=["full", "none"]))
    with pytest.raises(ExportError, match="dtype 'fp16'"):
        export_torchtitan(make_plan("tiny-llama", dtype="fp16"))


@pytest.mark.parametrize("name", sorted(MOE_PLANS))
def test_torchtitan_builds_the_planned_expert_parallel_meshes(name, load_recipe, fake_world):
    """torchtitan's ParallelDims lays out the plan's world: EP of the planned size over the
    ranks it borrows from dp_shard x cp x tp (efsdp the rest); MoE exactly on the planned layers."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    model, fields = MOE_PLANS[name]
    plan_file = make_plan(model, **fields)
    entry, spec = plan_file.plans[0], plan_file.model
    _, config = load_recipe(plan_file)
    config.model_spec.model.update_from_config(config=config)
    dims = ParallelDims.from_config(config.parallelism, world_size=entry.num_gpus)
    fake_world(entry.num_gpus)
    dims.build_mesh()  # asserts every mesh's size, efsdp = dp_shard * cp * tp / ep among them
    ep_mesh = dims.get_optional_mesh("ep")
    assert (ep_mesh.size() if ep_mesh is not None else 1) == entry.ep
    layers = config.model_spec.model.layers
    assert [layer.moe is not None for layer in layers] == [spec.is_moe_layer(i) for i in range(spec.num_layers)]
    moe = next(layer.moe for layer in layers if layer.moe is not None)
    assert (moe.num_experts, moe.router.top_k) == (spec.num_experts, spec.moe_top_k)
    assert moe.routed_experts.inner_experts.hidden_dim == spec.expert_ffn_hidden_size
    assert len(getattr(config.model_spec.model, "mtp_layers", [])) == spec.mtp_depth
    if spec.published_params:  # the built model (MTP aside) against the model's authors' count
        with torch.device("meta"):
            built = config.model_spec.model.build()
        params = sum(p.numel() for name, p in built.named_parameters() if not name.startswith("mtp_layers."))
        assert params == pytest.approx(spec.published_params, rel=0.01)


def built_on_cpu(config):
    """The recipe's model, built on the meta device, then materialised on the CPU and
    initialised by torchtitan's `init_states` (each parameter by its `param_init`)."""
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model.to_empty(device="cpu")
    model.init_states()
    return model


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-moe", "tiny-mla"])
def test_torchtitan_recipe_initialises_every_parameter(model, load_recipe):
    name = model.replace("mla", "moe")  # tiny-mla: tiny-moe with latent attention and MTP
    plan_file = make_plan(name, pp=1, stage_layers=[[0, resolve_model(name).num_layers]])
    _, config = load_recipe(tiny_mla(plan_file) if model == "tiny-mla" else plan_file)
    config.model_spec.model.update_from_config(config=config)
    params = dict(built_on_cpu(config).named_parameters())
    assert any(name.startswith("mtp_layers.") for name in params) == (model == "tiny-mla")
    assert all(torch.isfinite(p).all() for p in params.values())
    weights = [p for name, p in params.items() if "norm" not in name]
    assert all(0.015 < p.std() < 0.025 for p in weights)  # normal(0.02), not left empty


def test_torchtitan_moe_routes_like_the_torch_script(load_recipe):
    """The recipe's MoE layer, given the torch script's MoE weights, computes the same outputs
    (torchtitan runs the experts in bf16: 2% tolerance)."""
    from planner.export.torch_pp import moe_block_fields
    from planner.torch_blocks import BlockConfig, MoE

    plan_file = make_plan("tiny-moe", dp=2, ep=2, pp=1, num_microbatches=2, stage_layers=[[0, 6]])
    _, config = load_recipe(plan_file)
    titan = built_on_cpu(config)
    spec = plan_file.model
    torch.manual_seed(0)
    ours = MoE(BlockConfig(**spec.block_fields(), **moe_block_fields(spec)))
    theirs = titan.layers["1"].moe
    experts = theirs.routed_experts.inner_experts
    with torch.no_grad():
        theirs.router.gate.weight.copy_(ours.router.weight)
        for name in ("w1", "w2", "w3"):
            getattr(experts, {"w1": "w1_EFD", "w2": "w2_EDF", "w3": "w3_EFD"}[name]).copy_(getattr(ours.experts, name))
            getattr(theirs.shared_experts, name).weight.copy_(getattr(ours.shared_experts, name).weight)
    x = torch.randn(2, 16, spec.hidden_size)
    want, got = ours(x), theirs(x)
    assert (got - want).norm() / want.norm() < 0.02


@pytest.mark.parametrize(
    "model, fields, words",
    [
        ("deepseek-v3", dict(pp=2, stage_layers=[[0, 31], [31, 61]]), "MTP supports neither pipeline"),
        ("tiny-moe", dict(tp=2, ep=2, pp=1, stage_layers=[[0, 6]]), "expert tensor parallel 2 with ep 2"),
        ("tiny-moe", dict(tp=2, etp=1, pp=1, stage_layers=[[0, 6]]), "expert tensor parallel 1 with ep 1, tp 2"),
        ("tiny-moe", dict(dp=2, ep=2, pp=1, zero_stage=0, stage_layers=[[0, 6]]), "ZeRO-0 replicas"),
        ("tiny-llama", dict(dp=2, ep=2, pp=1, stage_layers=[[0, 4]]), "dense model"),
    ],
)
def test_torchtitan_refuses_moe_layouts_it_cannot_run(model, fields, words):
    with pytest.raises(ExportError, match=words) as refused:
        export_torchtitan(make_plan(model, **fields))
    assert "\n" not in str(refused.value)


def test_torchtitan_itself_cannot_lay_out_ep_over_replicas(fake_world):
    """The ZeRO-0 refusal is torchtitan's own limit: its meshes take EP from dp_shard x cp x
    tp only, so EP 2 over 2 DDP replicas fails in its mesh construction."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    dims = ParallelDims(dp_replicate=2, dp_shard=1, cp=1, tp=1, pp=1, ep=2, world_size=2)
    fake_world(2)
    with pytest.raises(ValueError, match="product of mesh_sizes"):  # efsdp = 1 * 1 * 1 // 2 = 0
        dims.build_mesh()


def test_torchtitan_itself_refuses_mtp_with_pipeline_parallelism(load_recipe):
    """The MTP refusal is torchtitan's own limit: its model config, given the MLA recipe with
    pipeline parallelism set, raises."""
    _, config = load_recipe(tiny_mla(make_plan("tiny-moe", pp=1, stage_layers=[[0, 6]])))
    config.parallelism.pipeline_parallel_degree = 2
    with pytest.raises(NotImplementedError, match="MTP does not support pipeline parallelism"):
        config.model_spec.model.update_from_config(config=config)


@pytest.mark.parametrize("name", ["qwen3_moe_ddp_ep_over_tp", "deepseek_v3_mla_mtp_ep64"])
def test_torchtitan_runs_deepep_plans_with_its_deepep_dispatcher(name, load_recipe):
    """A plan priced with DeepEP names torchtitan's DeepEP backend (moe_comm_backend "deepep"):
    torchtitan's own config code makes each MoE layer's token dispatcher its DeepEPTokenDispatcher
    and sizes its buffer from the training shape (update_from_config). Building it needs
    DeepEP's kernels, which do not install here; the all-to-all plan keeps the standard one."""
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher, DeepEPTokenDispatcher

    model, fields = MOE_PLANS[name]
    for dispatcher, kind in (("deepep", DeepEPTokenDispatcher.Config), ("alltoall", AllToAllTokenDispatcher.Config)):
        plan_file = make_plan(model, moe_dispatcher=dispatcher, **fields)
        _, config = load_recipe(plan_file)
        config.model_spec.model.update_from_config(config=config)
        moes = [layer.moe for layer in config.model_spec.model.layers if layer.moe is not None]
        dispatchers = [moe.routed_experts.token_dispatcher for moe in moes]
        assert all(type(d) is kind for d in dispatchers)
        if dispatcher == "deepep":
            assert all(d.num_max_tokens_per_rank and d.num_max_tokens_per_rank > 0 for d in dispatchers)


@pytest.mark.parametrize(
    "export, runtime",
    [("export_torchtitan", "torchtitan"), ("export_torch", "torch"), ("export_deepspeed", "deepspeed")],
)
@pytest.mark.parametrize(
    "field, value, what",
    [
        ("moe_ep_overlap", True, "Megatron's combined-1F1B all-to-all overlap"),
        ("moe_dispatcher", "deepep", "DeepEP's token dispatcher"),
    ],
)
def test_runtimes_without_the_mechanism_refuse_plans_priced_with_it(export, runtime, field, value, what):
    """One clear line naming the option, never a silent export of what the runtime will not run
    (torchtitan has DeepEP, so only its overlap refusal applies)."""
    import planner.export as exporters

    if (runtime, field) == ("torchtitan", "moe_dispatcher"):
        pytest.skip("torchtitan runs DeepEP (test above)")
    model = "tiny-llama" if runtime == "deepspeed" else "tiny-moe"  # DeepSpeed refuses MoE models outright
    fields = dict(dp=2, pp=1, stage_layers=[[0, resolve_model(model).num_layers]], num_microbatches=2)
    if model == "tiny-moe":
        fields["ep"] = 2
    with pytest.raises(
        ExportError, match=f"priced with {what} .*, but {runtime} .*; re-plan without it: `planner plan "
    ) as refused:
        getattr(exporters, export)(make_plan(model, **fields, **{field: value}))
    assert "\n" not in str(refused.value)
    getattr(exporters, export)(make_plan(model, **fields))  # the same plan without it is taken
