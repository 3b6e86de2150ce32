"""The command lines that errors and hints tell the user to type next.

Every message that names a `planner` option builds the command here, from literal option
names, so that one test (tests/cli/test_messages.py) can find each of them and check that
the option exists on the command the message names.
"""

from __future__ import annotations

REST_OF_REQUEST = "..."
"""Stands for the options the user already typed (model, GPUs, batch, sequence...)."""


def planner_command(command: str, *options: str) -> str:
    """`planner COMMAND ... OPTION VALUE ...`, back-quoted: what to type next, '...' standing
    for the rest of the user's request, e.g. planner_command("plan", "--runtime megatron")."""
    return "`" + " ".join(("planner", command, REST_OF_REQUEST, *options)) + "`"
