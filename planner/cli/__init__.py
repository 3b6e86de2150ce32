"""Command-line interface: `planner <command>`. Each command lives in its own module and
registers itself on the shared typer app; only this package prints to the terminal."""

# Command modules register themselves on `app` when imported.
from planner.cli import catalog as _catalog  # noqa: F401,E402
from planner.cli import cost as _cost  # noqa: F401,E402
from planner.cli import evaluate as _evaluate  # noqa: F401,E402
from planner.cli import export as _export  # noqa: F401,E402
from planner.cli import plan as _plan  # noqa: F401,E402
from planner.cli import profile as _profile  # noqa: F401,E402
from planner.cli import report_cmd as _report_cmd  # noqa: F401,E402
from planner.cli import runtimes_cmd as _runtimes_cmd  # noqa: F401,E402
from planner.cli import simulate as _simulate  # noqa: F401,E402
from planner.cli import sweep as _sweep  # noqa: F401,E402
from planner.cli.app import app, run


def main() -> None:
    """Entry point of the `planner` console script."""
    run()


__all__ = ["app", "main"]
