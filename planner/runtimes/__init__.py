"""Training runtimes as versioned objects: one module per runtime, its versions as data.

`resolve("megatron@2021")` returns that version, `resolve("megatron")` the newest; `planner
runtimes` lists them all with what each changes.
"""

from __future__ import annotations

from planner.errors import PlannerError
from planner.runtimes import (
    composer,
    deepspeed,
    hai_llm,
    internlm,
    megatron,
    meta,
    nanotron,
    nemo,
    torch_pipelining,
    torchtitan,
)
from planner.runtimes.base import Rule, RuntimeVersion

RUNTIMES: dict[str, tuple[RuntimeVersion, ...]] = {
    module.RUNTIME: module.VERSIONS
    for module in (
        megatron,
        nemo,
        torchtitan,
        torch_pipelining,
        deepspeed,
        composer,
        meta,
        hai_llm,
        internlm,
        nanotron,
    )
}
"""Runtime name -> its versions, the newest first."""


def resolve(text: str) -> RuntimeVersion:
    """The runtime version `NAME[@VERSION]` names (the newest version without one)."""
    name, _, version = text.partition("@")
    if name not in RUNTIMES:
        raise PlannerError(f"unknown runtime '{name}': choose one of {', '.join(RUNTIMES)} (see `planner runtimes`)")
    versions = RUNTIMES[name]
    if not version:
        return versions[0]
    found = next((v for v in versions if v.version == version), None)
    if found is None:
        raise PlannerError(
            f"unknown version '{version}' of {name}: choose one of "
            f"{', '.join(v.version for v in versions)} (see `planner runtimes`)"
        )
    return found


def exporting_runtimes() -> list[str]:
    """The runtimes whose newest version has an exporter (`planner export --to`)."""
    return [name for name, versions in RUNTIMES.items() if versions[0].exporter is not None]


__all__ = ["RUNTIMES", "Rule", "RuntimeVersion", "exporting_runtimes", "resolve"]
