"""`StageCosts`: the per-(rank, chunk) times and sizes the simulator consumes.

All tables are indexed [rank][chunk]; chunk c of a rank is its c-th smallest stage id (with
the looped placement stage c*P + r, with the V placement chunk 0 = stage r, chunk 1 = stage
2P-1-r). Times are for one micro-batch. A full backward B costs
backward_input_s + backward_weight_s; schedules that split it run the two parts as I and W.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ScheduleError

Table = tuple[tuple[float, ...], ...]


def _check_table(name: str, table: Table, num_ranks: int, vpp: int) -> None:
    if len(table) != num_ranks or any(len(row) != vpp for row in table):
        shape = [len(row) for row in table]
        raise ScheduleError(
            f"StageCosts.{name} must have {num_ranks} rows of {vpp} chunks (like forward_s), "
            f"got rows of lengths {shape}"
        )
    if any(x < 0 for row in table for x in row):
        raise ScheduleError(f"StageCosts.{name} has a negative entry: {table}")


def _flat(table: Table) -> list[float]:
    return [x for row in table for x in row]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Per-(rank, chunk) costs of one micro-batch, plus the pipeline link and stragglers."""

    forward_s: Table
    """Forward time of one micro-batch through the chunk, seconds."""
    backward_input_s: Table
    """Input-gradient backward (the paper's B, torch's I) of one micro-batch, seconds."""
    backward_weight_s: Table
    """Weight-gradient backward (W) of one micro-batch, seconds; a full B costs I + W."""
    p2p_s: float = 0.0
    """Time to move one micro-batch's activation (forward) or gradient (backward) to the
    adjacent stage on another rank, latency included; overlaps compute, no link contention."""
    send_hold_forward_s: float = 0.0
    """Blocking send/recv: seconds a rank's stream stays held after each forward whose output
    goes to another rank, while it exchanges with that rank (0: sends overlap compute, the
    default). With holds the transfer is inside them, so `p2p_s` is usually 0."""
    send_hold_backward_s: float = 0.0
    """The same after each backward (B or I) whose input gradient goes to another rank."""
    activation_bytes: Table | None = None
    """Bytes a micro-batch's activations occupy on the chunk from its F start until its
    backward-input (I or B) ends (the paper's M_B)."""
    weight_grad_bytes: Table | None = None
    """Bytes of those still held after I until W ends (the paper's M_W: layer inputs and output
    gradients that dW needs); None holds all of activation_bytes until W (upper bound)."""
    retained_bytes: Table | None = None
    """Bytes of those still held after the micro-batch's last backward action (W, or B) until
    the step ends: what the runtime keeps referenced (torch's schedule keeps each micro-batch's
    loss, and with it the graph its weight-gradient pass does not walk). None: nothing."""
    slowdown: tuple[float, ...] | None = None
    """Per-rank factor multiplying every compute time of that rank (straggler), 1.0 = nominal."""
    unit_scale: tuple[float, ...] | None = None
    """Per micro-batch index, a factor on its forward and input-grad times (W unscaled; a
    full B scales its I part): Seq1F1B's segments, whose causal attention grows with their
    position (`seq1f1b.causal_segment_scales`, repeated per micro-batch). None: all 1."""

    def __post_init__(self) -> None:
        num_ranks, vpp = self.num_ranks, self.vpp
        if num_ranks == 0 or vpp == 0:
            raise ScheduleError("StageCosts.forward_s must have at least one rank and one chunk")
        for name in ("forward_s", "backward_input_s", "backward_weight_s"):
            _check_table(name, getattr(self, name), num_ranks, vpp)
        for name in ("activation_bytes", "weight_grad_bytes", "retained_bytes"):
            table = getattr(self, name)
            if table is not None:
                _check_table(name, table, num_ranks, vpp)
        self._check_nested("weight_grad_bytes", "held until W", "activation_bytes", "held until I")
        self._check_nested(
            "retained_bytes",
            "held until the step ends",
            "weight_grad_bytes" if self.weight_grad_bytes is not None else "activation_bytes",
            "held until the backward ends",
        )
        for name in ("p2p_s", "send_hold_forward_s", "send_hold_backward_s"):
            if getattr(self, name) < 0:
                raise ScheduleError(f"StageCosts.{name} must be >= 0, got {getattr(self, name)}")
        if self.slowdown is not None and (len(self.slowdown) != num_ranks or any(x <= 0 for x in self.slowdown)):
            raise ScheduleError(f"StageCosts.slowdown needs {num_ranks} positive factors, got {self.slowdown}")
        if self.unit_scale is not None and any(x < 0 for x in self.unit_scale):
            raise ScheduleError(f"StageCosts.unit_scale factors must be >= 0, got {self.unit_scale}")

    def _check_nested(self, inner: str, inner_what: str, outer: str, outer_what: str) -> None:
        """`inner` bytes are a part of `outer` bytes on every chunk."""
        table = getattr(self, inner)
        if table is None:
            return
        if self.activation_bytes is None:
            raise ScheduleError(f"StageCosts.{inner} needs activation_bytes too")
        if any(part > whole for part, whole in zip(_flat(table), _flat(getattr(self, outer)))):
            raise ScheduleError(f"StageCosts.{inner} ({inner_what}) cannot exceed {outer} ({outer_what}) on any chunk")

    @property
    def num_ranks(self) -> int:
        """P, the number of pipeline ranks."""
        return len(self.forward_s)

    @property
    def vpp(self) -> int:
        """V, the number of chunks per rank."""
        return len(self.forward_s[0]) if self.forward_s else 0

    @classmethod
    def uniform(cls, pp: int, vpp: int, f: float, i: float, w: float, p2p: float = 0.0) -> StageCosts:
        """Every chunk of every rank costs forward `f`, input-grad `i`, weight-grad `w` seconds."""
        if pp < 1 or vpp < 1:
            raise ScheduleError(f"StageCosts.uniform needs pp >= 1 and vpp >= 1, got pp={pp}, vpp={vpp}")

        def table(x: float) -> Table:
            return tuple((float(x),) * vpp for _ in range(pp))

        return cls(forward_s=table(f), backward_input_s=table(i), backward_weight_s=table(w), p2p_s=float(p2p))
