"""The typer application and the one place user errors become a line on stderr and exit 2."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from planner.errors import PlannerError

HELP_WIDTH = 120
"""Widest `--help` text: the terminal's width up to this."""
app = typer.Typer(
    name="planner",
    help="Plan tensor / pipeline / data parallel layouts for transformer training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: every option name whole at 80 columns, where rich's boxed panels cut them
    rich_markup_mode=None,
    context_settings={"max_content_width": HELP_WIDTH},
)

PIPE_WIDTH = 200
"""Output width when stdout is not a terminal (a pipe or file): wide tables stay unsquashed."""
stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


def fit_to_terminal() -> None:
    """Lay stdout out in the terminal's width (COLUMNS when set), or PIPE_WIDTH for a pipe or file."""
    stdout.width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH


EXIT_USER_ERROR = 2


def fail(message: str) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise (code 2)."""
    stderr.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(EXIT_USER_ERROR)


def print_json(text: str) -> None:
    """Write a JSON document to stdout untouched by rich (programs parse it)."""
    sys.stdout.write(text)
    sys.stdout.write("\n")


def run(argv: list[str] | None = None) -> None:
    """Run the app, mapping PlannerError to one line on stderr and exit code 2."""
    fit_to_terminal()
    try:
        code = app(args=argv, standalone_mode=False)
    except PlannerError as exc:
        raise SystemExit(fail(str(exc)).exit_code) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        stderr.print("aborted", markup=False)
        raise SystemExit(130) from None
    except KeyboardInterrupt:
        stderr.print("interrupted", markup=False)
        raise SystemExit(130) from None
    except Exception as exc:
        # Usage errors (missing or malformed options) are click exceptions; typer vendors
        # click in some releases, so recognise them by their interface.
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            raise SystemExit(code) from None
        raise
    if isinstance(code, int) and code:
        # With standalone_mode=False an Exit raised inside a command comes back as its code.
        raise SystemExit(code)
