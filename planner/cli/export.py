"""`planner export`: write what a training runtime reads for one plan of a plan file."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from planner.cli.app import app, stdout
from planner.errors import ConfigError
from planner.export import EXPORTERS, export_plan
from planner.plan import parse_plan_file

EXECUTABLE_SUFFIXES = (".sh",)


@app.command("export")
def export_command(
    plan: Path = typer.Argument(..., help="Plan file written by `planner plan -o` (JSON)."),
    to: str = typer.Option(..., "--to", "-t", help=f"Runtime: {' | '.join(EXPORTERS)}."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the files into (created if missing)."),
    index: int = typer.Option(0, "--index", "-i", help="Which plan of the file (0 = the best).", min=0),
) -> None:
    """Write the launch configuration of one plan for Megatron-LM, torchtitan, a
    torch.distributed.pipelining script or DeepSpeed."""
    try:
        text = plan.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read plan file {plan}: {exc.strerror}") from None
    files = export_plan(parse_plan_file(text, str(plan)), to, index)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    width = max(len(name) for name in files)
    stdout.print(f"wrote {len(files)} files for {to} (plan #{index} of {plan}) to {out}/:",
                 markup=False, highlight=False)
    for name, content in files.items():
        path = out / name
        path.write_text(content)
        if name.endswith(EXECUTABLE_SUFFIXES) or content.startswith("#!"):
            os.chmod(path, 0o755)
        stdout.print(f"  {name:<{width}}  {len(content.encode()):>9,} bytes", markup=False, highlight=False)
