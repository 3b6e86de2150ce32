"""What every exporter shares: picking the plan, checks several runtimes make, and the
provenance (planner version, layout, predicted figures) each output records."""

from __future__ import annotations

from planner.errors import ExportError
from planner.hints import planner_command
from planner.plan import PlanEntry, PlanFile
from planner.runtimes import resolve
from planner.schedule.registry import schedule_info
from planner.spec import ModelSpec

Files = dict[str, str]
"""Output of an exporter: file name (relative to the output folder) -> file content."""

PROVENANCE_FILE = "PLANNER_PROVENANCE.md"


def select_plan(plan_file: PlanFile, index: int) -> PlanEntry:
    """The plan at `index` of the file, the table's number `index + 1` (ExportError naming the
    valid numbers, or the schedule when no runtime runs it)."""
    if not 0 <= index < len(plan_file.plans):
        raise ExportError(
            f"there is no plan number {index + 1}: the file holds {len(plan_file.plans)} plan(s), "
            f"pick one with {planner_command('export', f'--number 1..{len(plan_file.plans)}')}"
        )
    entry = plan_file.plans[index]
    unexported = schedule_info(entry.schedule).simulated_only
    if unexported is not None:
        raise ExportError(
            f"schedule '{entry.schedule}' is planned and simulated only: no runtime the planner exports to "
            f"(megatron, torchtitan, torch, deepspeed) runs {unexported}"
        )
    return entry


def require_model(plan_file: PlanFile, runtime: str) -> ModelSpec:
    """The model the plan was made for; exporters need it to write model arguments."""
    if plan_file.model is None:
        raise ExportError(
            f"{runtime}: the plan file has no 'model' section, so the model's shape is unknown; "
            f"write the plan with {planner_command('plan', '-o plan.json')} (which records the model) "
            "and export that file"
        )
    return plan_file.model


def check_positions(entry: PlanEntry, spec: ModelSpec, runtime: str) -> None:
    """ExportError where the plan's sequence needs another model than `spec`: longer than its
    learned position table, or than its sliding attention window (no exporter writes a window:
    within it, attention is plain causal attention)."""
    if spec.position_embedding == "learned" and entry.seq > spec.max_position_embeddings:
        raise ExportError(
            f"{runtime}: seq {entry.seq} is longer than the {spec.max_position_embeddings} learned "
            f"positions of {spec.name}; re-plan with a shorter sequence: "
            f"{planner_command('plan', f'--seq {spec.max_position_embeddings}')}"
        )
    if spec.sliding_window is not None and entry.seq > spec.sliding_window:
        raise ExportError(
            f"{runtime}: seq {entry.seq} is longer than the {spec.sliding_window}-token sliding "
            f"attention window of {spec.name}, which the planner prices and exports as full causal "
            f"attention; re-plan with a sequence within it: {planner_command('plan', f'--seq {spec.sliding_window}')}"
        )


def uniform_recompute(entry: PlanEntry, runtime: str) -> str:
    """The one recompute mode of every pipeline rank (`check_rules` has refused ranks that differ
    for a runtime that applies one setting to every stage)."""
    check_rules(entry, runtime)
    return entry.recompute_of(0)


def check_rules(entry: PlanEntry, runtime: str) -> None:
    """ExportError for the first rule of `runtime` (planner/runtimes/) that the plan breaks:
    the same rules that keep `planner plan --runtime` to what the runtime runs."""
    version = resolve(runtime)
    modes = [entry.recompute_of(rank) for rank in range(entry.pp)]
    per_rank = ", ".join(f"rank {r}: {mode}" for r, mode in enumerate(modes))
    asked = (
        ("schedules", entry.schedule, f"schedule '{entry.schedule}' (vpp={entry.vpp})"),
        ("tp", entry.tp, f"tensor parallelism (tp={entry.tp})"),
        ("cp", entry.cp, f"context parallelism (cp={entry.cp})"),
        ("zero", entry.zero_stage, f"ZeRO-{entry.zero_stage} with pipeline parallelism (pp={entry.pp})"),
        *(("recompute", mode, f"{mode} recompute") for mode in sorted(set(modes))),
        ("per_rank_recompute", len(set(modes)) > 1, f"recompute differs per pipeline rank ({per_rank})"),
    )
    for dimension, value, what in asked:
        why = version.rule_refusal(dimension, value, pipelined=entry.pp > 1)
        if why is not None:
            raise ExportError(f"{runtime}: {what}: {why}; {replan_for(runtime)}")


MECHANISM_NAMES = {
    "moe_dispatcher": (
        "DeepEP's token dispatcher (moe_dispatcher 'deepep')",
        planner_command("plan", "--moe-dispatcher alltoall"),
    ),
    "moe_ep_overlap": (
        "Megatron's combined-1F1B all-to-all overlap (moe_ep_overlap)",
        planner_command("plan", "--no-moe-ep-overlap"),
    ),
}
"""PlanEntry field -> (what a plan priced with it was priced with, the command that plans without it)."""


def mechanism_refusal(runtime: str, moe_dispatcher: str, moe_ep_overlap: bool) -> tuple[str, str] | None:
    """(PlanEntry field, why `runtime` does not run it) for the first MoE mechanism named that
    `runtime` (NAME[@VERSION], planner/runtimes/) does not run, else None."""
    version = resolve(runtime)
    for field, value in (("moe_dispatcher", moe_dispatcher), ("moe_ep_overlap", moe_ep_overlap)):
        why = version.unsupported_reason(field, value)
        if why is not None:
            return field, why
    return None


def check_moe_mechanisms(entry: PlanEntry, runtime: str) -> None:
    """ExportError when the plan was priced with an MoE mechanism `runtime` does not run."""
    refused = mechanism_refusal(runtime, entry.moe_dispatcher, entry.moe_ep_overlap)
    if refused is not None:
        field, why = refused
        what, without = MECHANISM_NAMES[field]
        raise ExportError(
            f"{runtime}: the plan was priced with {what}, but {runtime} {why}; re-plan without it: {without}"
        )


def attention_refusal(runtime: str, attention: str | None) -> str | None:
    """Why `runtime` does not run the attention kernel `attention` (None: the runtime's
    default), or None when nothing stands in the way."""
    why = None if attention is None else resolve(runtime).unsupported_reason("attention", attention)
    if why is None:
        return None
    return (
        f"the plan was priced with --attention {attention}, but {runtime} {why}; "
        f"re-plan with the runtime's own kernel: {planner_command('plan', '--attention flash2')}"
    )


def check_attention_kernel(entry: PlanEntry, runtime: str) -> None:
    """ExportError when the plan was priced with an attention kernel `runtime` does not run."""
    reason = attention_refusal(runtime, entry.attention)
    if reason is not None:
        raise ExportError(f"{runtime}: {reason}")


def replan_for(runtime: str) -> str:
    """The advice to search again among the plans `runtime` runs, as the command to type."""
    return f"re-plan for {runtime} with {planner_command('plan', f'--runtime {runtime}')}"


def stage_sizes(entry: PlanEntry) -> list[int]:
    """Number of transformer layers of each virtual stage, in model order."""
    return [end - start for start, end in entry.ranges_in_model_order()]


def summary_lines(plan_file: PlanFile, entry: PlanEntry, index: int, runtime: str) -> list[str]:
    """Human-readable lines: the runtime version the files target, who wrote the plan, its
    layout and what it predicts."""
    model = plan_file.model.name if plan_file.model else "(not recorded)"
    target = resolve(runtime)
    lines = [
        f"written for {target.name}: {target.summary}",
        f"planner {plan_file.planner_version or '(version not recorded)'}, "
        f"costs: {plan_file.cost_source or '(not recorded)'}, plan #{index + 1} of {len(plan_file.plans)}",
        f"model {model}",
    ]
    if plan_file.cluster is not None:
        c = plan_file.cluster
        lines.append(f"cluster: {c.num_gpus} x {c.gpu}, {c.gpus_per_node} per node")
    lines.append(
        f"layout: tp={entry.tp} pp={entry.pp} dp={entry.dp} cp={entry.cp} vpp={entry.vpp} "
        f"mbs={entry.mbs} microbatches={entry.num_microbatches} global_batch={entry.global_batch} "
        f"seq={entry.seq} schedule={entry.schedule} recompute={entry.recompute} "
        f"sequence_parallel={entry.sequence_parallel} zero_stage={entry.zero_stage} dtype={entry.dtype}"
    )
    if entry.ep > 1 or entry.moe_dispatcher != "alltoall" or entry.moe_ep_overlap:
        lines.append(
            f"experts: ep={entry.ep} etp={entry.etp or entry.tp} precision={entry.precision} "
            f"moe_dispatcher={entry.moe_dispatcher} moe_ep_overlap={entry.moe_ep_overlap}"
        )
    lines.append(f"stage layers (per rank): {entry.stage_layers}")
    p = entry.predicted
    if p is not None:
        lines.append(
            f"predicted: step {p.step_time_s:.4g} s, {p.tokens_per_s:,.0f} tokens/s, "
            f"MFU {p.mfu:.1%}, bubble {p.bubble_fraction:.1%}"
        )
        lines.append(
            "predicted peak memory per pipeline rank (GiB): " + ", ".join(f"{m:.1f}" for m in p.memory_gb_per_stage)
        )
    return lines


def comment_block(lines: list[str], prefix: str = "# ") -> str:
    """`lines` as a comment block, one comment line each, ending with a newline."""
    return "".join(f"{prefix}{line}".rstrip() + "\n" for line in lines)


def provenance_readme(
    plan_file: PlanFile, entry: PlanEntry, index: int, runtime: str, files: dict[str, str], exporter: str
) -> str:
    """The sidecar Markdown file: provenance of the export and what each written file is for."""
    body = [f"# {runtime} export of a planner plan", ""]
    body += [f"- {line}" for line in summary_lines(plan_file, entry, index, exporter)]
    body += ["", "## Files", ""]
    body += [f"- `{name}`: {what}" for name, what in files.items()]
    return "\n".join(body) + "\n"


def node_shape(plan_file: PlanFile, entry: PlanEntry) -> tuple[int, int]:
    """(nodes, GPUs per node) the plan runs on: the plan file's cluster, else nodes of up to 8."""
    per_node = plan_file.cluster.gpus_per_node if plan_file.cluster else min(8, entry.num_gpus)
    per_node = min(per_node, entry.num_gpus)
    return max(1, entry.num_gpus // per_node), per_node


def launch_preamble(plan_file: PlanFile, entry: PlanEntry, what: str, header: str, note: str = "") -> str:
    """The opening of a launch script run once per node: the shebang, what it launches on which
    nodes and GPUs, `note` (comment lines), the provenance `header`, and bash's strict mode."""
    nodes, per_node = node_shape(plan_file, entry)
    return f"""#!/usr/bin/env bash
# Launch {what} for the planned layout ({entry.num_gpus} GPUs:
# {nodes} node(s) x {per_node} GPUs; tp={entry.tp} pp={entry.pp} cp={entry.cp} dp={entry.dp}).
# Run once on every node with NODE_RANK set; MASTER_ADDR is the address of node 0.
{note}#
{header.rstrip()}
set -euo pipefail
"""


def torchrun_script(
    plan_file: PlanFile, entry: PlanEntry, header: str, what: str, setup: str, program: list[str]
) -> str:
    """A bash launch script that runs `program` (torchrun's program and its arguments, one per
    line) under torchrun on every node of the plan's cluster, after the `setup` lines."""
    nodes, per_node = node_shape(plan_file, entry)
    arguments = "".join(f"    {word} \\\n" for word in program)
    return f"""{launch_preamble(plan_file, entry, what, header)}{setup.rstrip()}
torchrun \\
    --nproc-per-node {per_node} \\
    --nnodes {nodes} \\
    --node-rank "${{NODE_RANK:-0}}" \\
    --master-addr "${{MASTER_ADDR:-localhost}}" \\
    --master-port "${{MASTER_PORT:-6000}}" \\
{arguments}    "$@"
"""
