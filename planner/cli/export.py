"""`planner export`: write what a training runtime reads for one plan of a plan file."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.api import document_request, rechecked
from planner.cli.app import app, stdout
from planner.errors import ConfigError, ExportError, PlannerError
from planner.export import EXPORTERS, export_plan
from planner.hints import serving_request
from planner.output import refuse_existing, write_atomic
from planner.plan import PlanFile, parse_plan_file
from planner.runtimes import RUNTIMES, resolve

EXECUTABLE_SUFFIXES = (".sh",)


def exporter_of(target: str) -> str:
    """The exporter of `--to NAME[@VERSION]`: only a runtime's newest version is written."""
    if "@" not in target:
        return target
    version = resolve(target)
    if version.exporter is None:
        newest = RUNTIMES[version.runtime][0]
        raise ExportError(
            f"{version.name} is priced, not exported: the exporters write the newest version of a "
            f"runtime ({newest.name}{'' if newest.exporter else ', which has none either'})"
        )
    return version.exporter


def request_flags(document: PlanFile) -> list[str]:
    """The flags of the request the plan file records (none for a file without one)."""
    try:
        request, _ = document_request(document)
    except PlannerError:
        return []
    return request.cluster_flags() + request.option_flags()


@app.command("export")
def export_command(
    plan: Path = typer.Argument(..., help="Plan file written by `planner plan -o` (JSON)."),
    to: str = typer.Option(
        ...,
        "--to",
        "-t",
        help=f"Runtime: {' | '.join(EXPORTERS)}, or NAME@VERSION of its newest version (`planner runtimes`).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the files into (created if missing)."),
    number: int = typer.Option(
        1, "--number", help="The plan's number in `planner plan`'s table (1 = the best).", min=1
    ),
    force: bool = typer.Option(
        False, "--force", help="Overwrite the export's files that exist in the folder (its other files stay)."
    ),
) -> None:
    """Write the launch configuration of one plan for Megatron-LM, torchtitan, a
    torch.distributed.pipelining script or DeepSpeed; the plan is checked against its model
    and cluster and priced afresh first, so a hand-edited plan that breaks a rule is refused."""
    try:
        text = plan.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read plan file {plan}: {exc.strerror}") from None
    document = parse_plan_file(text, str(plan))
    notes: list[str] = []
    index = number - 1
    with serving_request(request_flags(document)):
        if index < len(document.plans):
            document, notes = rechecked(document, index)
        files = export_plan(document, exporter_of(to), index)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {out} exists and is not a folder")
    refuse_existing(*(out / name for name in files), force=force)
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():  # every file first: a closed stdout cannot leave the export half written
        write_atomic(out / name, content, executable=name.endswith(EXECUTABLE_SUFFIXES) or content.startswith("#!"))
    width = max(len(name) for name in files)
    stdout.print(
        f"wrote {len(files)} files for {to} (plan #{number} of {plan}) to {out}/:", markup=False, highlight=False
    )
    for note in notes:
        stdout.print(f"note: {note}", markup=False, highlight=False)
    for name, content in files.items():
        stdout.print(f"  {name:<{width}}  {len(content.encode()):>9,} bytes", markup=False, highlight=False)
