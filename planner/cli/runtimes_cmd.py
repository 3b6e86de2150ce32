"""`planner runtimes`: the training runtimes and versions `--runtime NAME@VERSION` takes."""

from __future__ import annotations

import json
import textwrap

import typer
from rich.table import Table

from planner.cli.app import app, print_json, stdout
from planner.cost.model import CostOptions
from planner.cost.options import FIELD_GROUP
from planner.request import option_text
from planner.runtimes import RUNTIMES


@app.command("runtimes")
def runtimes_command(
    options: bool = typer.Option(False, "--options", help="List the cost options `--set NAME=VALUE` takes."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the runtimes and their versions: what each runs and how, with its sources."""
    if options:
        defaults = CostOptions().flat()
        if as_json:
            print_json(
                json.dumps(
                    {
                        "options": [
                            {"name": name, "group": FIELD_GROUP[name], "default": value}
                            for name, value in defaults.items()
                        ]
                    },
                    indent=2,
                    default=str,
                )
            )
            return
        table = Table(title="Cost options (--set NAME=VALUE; docs/cost_options.md says what each is)")
        for column in ("name", "group", "default"):
            table.add_column(column)
        for name, value in defaults.items():
            table.add_row(name, FIELD_GROUP[name], option_text(value))
        stdout.print(table)
        return
    rows = [
        {
            "runtime": v.runtime,
            "version": v.version,
            "newest": index == 0,
            "exporter": v.exporter,
            "summary": v.summary,
            "costs": v.costs,
            "attention": v.attention,
            "prefers_cudnn": v.prefers_cudnn,
            "rules": {rule.dimension: list(rule.allowed) for rule in v.rules},
            "sources": list(v.sources),
        }
        for versions in RUNTIMES.values()
        for index, v in enumerate(versions)
    ]
    if as_json:
        print_json(json.dumps({"runtimes": rows}, indent=2, default=list))
        return
    stdout.print("Runtimes (--runtime NAME runs the newest version, NAME@VERSION an older one)", markup=False)
    for row in rows:
        costs = ", ".join(f"{name}={option_text(value)}" for name, value in row["costs"].items()) or "none"
        export = f"export: --to {row['exporter']}" if row["exporter"] else "priced only, no exporter"
        stdout.print(f"\n{row['runtime']}@{row['version']}  ({export})", markup=False, highlight=False)
        for label, text in (("", row["summary"]), ("sets: ", costs), ("sources: ", "; ".join(row["sources"]))):
            stdout.print(
                textwrap.fill(
                    f"{label}{text}", width=max(40, stdout.width), initial_indent="  ", subsequent_indent="    "
                ),
                markup=False,
                highlight=False,
            )
