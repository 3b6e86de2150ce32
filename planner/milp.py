"""The MILP solver behind pulp formulations (stage cuts, the exact zero-bubble schedule).

pulp 3.3 deprecates `PULP_CBC_CMD` (the CBC binary bundled inside pulp) for removal in 4.0:
"Install CBC with `pip install pulp[cbc]` and use COIN_CMD instead". So: `COIN_CMD` when a
CBC binary is on PATH (the `pulp[cbc]` extra, or a system CBC), else `HiGHS` through
highspy, a dependency of planner. Both prove optimality; only CBC takes a warm start.
"""

from __future__ import annotations

import pulp

from planner.errors import PlannerError


def mip_solver(time_limit_s: float, *, warm_start: bool = False) -> pulp.LpSolver:
    """A quiet MILP solver with a time limit: CBC (`COIN_CMD`) if installed, else HiGHS.
    `warm_start` passes the variables' initial values to CBC; HiGHS ignores them."""
    cbc = pulp.COIN_CMD(msg=False, timeLimit=time_limit_s, warmStart=warm_start)
    if cbc.available():
        return cbc
    highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s)
    if highs.available():
        return highs
    raise PlannerError("no MILP solver: pip install highspy (or pulp[cbc] for CBC)")
