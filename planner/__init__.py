"""planner: auto-parallel configuration planner for transformer training.

The Python API (planner/api.py): `Request`, `plan`, `evaluate`; the same objects the command
line prints as JSON.
"""

from planner.api import evaluate, plan
from planner.request import Request
from planner.version import __version__

__all__ = ["Request", "__version__", "evaluate", "plan"]
