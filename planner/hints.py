"""The command lines that errors and hints tell the user to type next.

Every message that names a `planner` option builds the command here, from literal option
names, so that one test (tests/cli/test_messages.py) can find each of them and check that
the option exists on the command the message names. Inside a command line the hint is
whole: the arguments the user typed that the named command also takes, with the hint's
options in place of those they name; outside one (the Python API) '...' stands for them.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

try:  # typer vendors click from 0.2x on; before, it runs on click itself
    from typer._click.globals import get_current_context
except ImportError:
    from click import get_current_context

REST_OF_REQUEST = "..."
"""Stands for the options the user typed, where no command line is being served."""

REQUEST_COMMANDS = ("plan", "evaluate", "sweep")
"""The commands a request's flags (`Request.cluster_flags`, `option_flags`) are typed to."""

OUTPUTS = ("out", "report", "svg", "force", "as_json")
"""Parameters that say where output goes, not what to compute: a hint leaves them out unless
its command needs them (the files a hint's command writes are the user's next choice)."""

_served_request: ContextVar[tuple[str, ...] | None] = ContextVar("served_request", default=None)


@contextmanager
def serving_request(words: list[str]) -> Iterator[None]:
    """Within it, a hint for a request command carries these request flags (e.g. `export`
    serving the request its plan file records)."""
    token = _served_request.set(tuple(words))
    try:
        yield
    finally:
        _served_request.reset(token)


def planner_command(command: str, *options: str, arguments: tuple[str, ...] = ()) -> str:
    """`planner COMMAND [ARGUMENTS] <the user's arguments> OPTION VALUE ...`, back-quoted: what
    to type next, e.g. planner_command("plan", "--runtime megatron"); `arguments` are the
    command's positional ones (e.g. the plan file `export` reads)."""
    typed = _typed_arguments(command, options)
    served = _served_request.get()
    if typed is None and served and command in REQUEST_COMMANDS:
        typed = _without(list(served), _named_flags(options))
    rest = [REST_OF_REQUEST] if typed is None else typed
    return "`" + " ".join(("planner", command, *map(shlex.quote, arguments), *rest, *options)) + "`"


def _typed_arguments(command: str, options: tuple[str, ...]) -> list[str] | None:
    """The arguments of the command line being served that `command` takes too, as words,
    leaving out those `options` set: all of them for the command being served and between two
    request commands (those taking a model), none where another `command` takes no model (its
    options are the whole command); None outside a command line, or from a command without a
    request to one with."""
    context = get_current_context(silent=True)
    if context is None or context.parent is None:
        return None
    group = context.find_root().command
    target = group.get_command(context, command) if hasattr(group, "get_command") else None
    if target is None:
        return None
    takes = {param.name: param for param in target.params}
    same = target.name == context.command.name
    if not same and "model" not in takes:
        return []
    if not same and "model" not in {param.name for param in context.command.params}:
        return None
    replaced = _named_flags(options)
    words: list[str] = []
    for param in context.command.params:
        source = context.get_parameter_source(param.name)
        if param.name not in takes or source is None or source.name != "COMMANDLINE":
            continue
        own = takes[param.name]
        if replaced & {*own.opts, *own.secondary_opts} or (param.name in OUTPUTS and not own.required):
            continue
        words += _words(own, context.params[param.name])
    return words


def _words(param: Any, value: Any) -> list[str]:
    """The words that give `param` (a click parameter) this value on a command line."""
    if param.param_type_name == "argument":
        return [shlex.quote(str(value))]
    flag = max(param.opts, key=len)
    if getattr(param, "is_flag", False):
        if value:
            return [flag]
        return [max(param.secondary_opts, key=len)] if param.secondary_opts else []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [word for item in values for word in (flag, shlex.quote(str(item)))]


def _named_flags(options: tuple[str, ...]) -> set[str]:
    """The flags a hint's options name."""
    return {word for option in options for word in option.split() if word.startswith("-")}


def _without(words: list[str], flags: set[str]) -> list[str]:
    """Command-line words less each flag of `flags` and the value after it."""
    kept: list[str] = []
    skip_value = False
    for word in words:
        if skip_value and not word.startswith("-"):
            skip_value = False
            continue
        skip_value = word in flags
        if not skip_value:
            kept.append(shlex.quote(word))
    return kept
