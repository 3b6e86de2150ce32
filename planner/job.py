"""From a `Request` to the job it describes: model, cluster, runtime version and cost model.

`build` is the one path every command, the Python API and the published-runs harness take;
`cost_options` is how a runtime version and a request's settings become `CostOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.calibration import schema as calibration_schema
from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import AnalyticSource, CostModel, analytic_compute
from planner.cost.options import CostOptions
from planner.errors import ConfigError, LayoutError, PlannerError
from planner.request import Request, option_flag
from planner.runtimes import RuntimeVersion, resolve
from planner.spec import Cluster, GpuSpec, ModelSpec
from planner.uncertainty import default_memory_headroom

MOE_ONLY_OPTIONS = ("moe_dispatcher", "moe_ep_overlap")
"""Cost options that change nothing on a dense model, so a runtime that lacks them does not
refuse a dense model's request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A request, resolved."""

    request: Request
    spec: ModelSpec
    cluster: Cluster
    runtime: RuntimeVersion | None
    cost_model: CostModel
    calibration: calibration_schema.CalibrationFile | None


def build(request: Request, spec: ModelSpec | None = None, gpu: GpuSpec | None = None) -> Job:
    """The job `request` describes (`spec` in place of reading `request.model` again, `gpu` in
    place of the preset `request.gpu` names)."""
    spec = spec or resolve_model(request.model)
    calibration = None if request.calibration is None else calibration_schema.load(Path(request.calibration))
    cluster = build_cluster(request, calibration, gpu)
    runtime = None if request.runtime is None else resolve(request.runtime)
    check_runtime_options(runtime, spec, request.options)
    options = cost_options(runtime, cluster.gpu, request.options)
    profile = None if request.profile is None else Path(request.profile)
    cost_model = build_cost_model(spec, cluster, profile, options, request.profile_only)
    return Job(
        request=request, spec=spec, cluster=cluster, runtime=runtime, cost_model=cost_model, calibration=calibration
    )


def build_cluster(
    request: Request, calibration: calibration_schema.CalibrationFile | None = None, gpu: GpuSpec | None = None
) -> Cluster:
    """The request's GPUs with its overrides (and, with a calibration, the GPU's efficiencies
    replaced by the fitted ones); `gpu` in place of the preset `request.gpu` names."""
    gpu = gpu or resolve_gpu(request.gpu)
    if calibration is not None:
        if calibration.gpu != gpu.name:
            raise ConfigError(f"the calibration file describes GPU {calibration.gpu}, but --gpu is {gpu.name}")
        gpu = gpu.model_copy(update={"efficiency": calibration.efficiency})
    return Cluster.of(
        gpu,
        request.num_gpus,
        gpus_per_node=request.gpus_per_node,
        intra_node_bw_gbps=request.intra_node_bw_gbps,
        inter_node_bw_gbps=request.inter_node_bw_gbps,
        memory_limit_gib=request.max_memory_gb,
        memory_headroom=memory_headroom(request),
        memory_scale=calibration.memory_scale if calibration is not None else None,
    )


def memory_headroom(request: Request) -> float:
    """The share of the memory the request's plans keep free: its own, or the default."""
    if request.memory_headroom is not None:
        return request.memory_headroom
    return default_memory_headroom().share


def default_attention(runtime: RuntimeVersion | None, gpu: GpuSpec | None) -> str:
    """The attention kernel `runtime` runs on `gpu`; without a runtime, Megatron-LM's
    (Transformer Engine: cuDNN where the GPU has measured cuDNN rates, else FlashAttention-2)."""
    return (runtime or resolve("megatron")).default_attention(gpu)


def cost_options(
    runtime: RuntimeVersion | None, gpu: GpuSpec | None = None, settings: dict[str, Any] | None = None
) -> CostOptions:
    """The cost options of plans `runtime` runs on `gpu`, with `settings` (CostOptions field
    names) set over the version's own."""
    settings = settings or {}
    fields = {
        **(runtime.costs if runtime is not None else {}),
        "attention": default_attention(runtime, gpu),
        **settings,
    }
    try:
        options = CostOptions.of(**fields)
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"cost options: {exc}") from None
    if "speed_spread" in settings and settings["speed_spread"] is not None:
        from planner.cost.stragglers import load_speed_spread

        load_speed_spread(settings["speed_spread"])
    return options


def runtime_cost_options(
    runtime: str | None, gpu: GpuSpec | None = None, attention: str | None = None, **settings: Any
) -> CostOptions:
    """The cost options of plans the runtime named `NAME[@VERSION]` runs on `gpu`."""
    version = None if runtime is None else resolve(runtime)
    return cost_options(version, gpu, {**settings, **({"attention": attention} if attention else {})})


def check_runtime_options(runtime: RuntimeVersion | None, spec: ModelSpec, settings: dict[str, Any]) -> None:
    """Refuse settings `runtime` does not run (MoE mechanisms only on an MoE model)."""
    if runtime is None:
        return
    for name, value in settings.items():
        if name in MOE_ONLY_OPTIONS and not spec.is_moe:
            continue
        why = runtime.unsupported_reason(name, value)
        if why is not None:
            raise LayoutError(
                f"{' '.join(option_flag(name, value))}: {runtime.runtime} {why}; drop the option or plan "
                "for another runtime"
            )


def parse_setting(text: str) -> tuple[str, Any]:
    """'p2p_mode=blocking' -> ('p2p_mode', 'blocking'), the value typed as the option's default."""
    name, sep, raw = text.partition("=")
    name, raw = name.strip().replace("-", "_"), raw.strip()
    defaults = CostOptions().flat()
    if not sep or name not in defaults:
        raise LayoutError(
            f"--set takes NAME=VALUE with NAME a cost option ({', '.join(sorted(defaults))}); got '{text}'"
        )
    default = defaults[name]
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false"):
                raise ValueError
            return name, raw.lower() == "true"
        if isinstance(default, int):
            return name, int(raw)
        if isinstance(default, float):
            return name, float(raw)
        if isinstance(default, tuple):
            return name, tuple(part.strip() for part in raw.split(",") if part.strip())
    except ValueError:
        raise LayoutError(f"--set {name}: '{raw}' is not a {type(default).__name__}") from None
    return name, raw


def build_cost_model(
    spec: ModelSpec,
    cluster: Cluster,
    profile: Path | None,
    options: CostOptions = CostOptions(),
    profile_only: bool = False,
) -> CostModel:
    """The cost model: analytic, or on a measured profile where it spans a shape and the
    analytic model calibrated on that profile elsewhere (and for the recomputation and
    overlap estimates the cost model makes itself)."""
    if profile is None:
        if profile_only:
            raise PlannerError("--profile-only needs --profile FILE")
        return CostModel(spec, cluster, options)
    from planner.cost.calibrate import fit_file, fitted_gpu
    from planner.cost.comm import Network
    from planner.profile.lookup import MeasuredFirst, profiled_source
    from planner.profile.node_comm import network_curves

    measured = profiled_source(profile, spec, cluster.gpu)
    # the node's measured collectives replace the model for groups inside one node
    network = Network.of(cluster, measured=network_curves(measured.profile))
    try:
        calibration = fit_file(profile, measured.profile, cluster.gpu)
    except PlannerError:  # nothing to fit on (only recompute rows): the preset's efficiencies
        fallback = AnalyticSource(spec, analytic_compute(cluster.gpu, options))
        return CostModel(spec, cluster, options, MeasuredFirst(measured, fallback, "analytic"), network)
    gpu = fitted_gpu(cluster.gpu, calibration.efficiency, measured.profile.dtype, options.kernels.dtype)
    fallback = AnalyticSource(spec, analytic_compute(gpu, options))  # as the fit: flash, fused traffic
    source = MeasuredFirst(measured, fallback, "calibrated", calibration)
    return CostModel(spec, cluster.model_copy(update={"gpu": gpu}), options, source, network)
