"""How a communication group sits on the nodes.

Ranks are laid out with TP fastest, then CP, then DP, then PP (Megatron-LM's default
"tp-cp-ep-dp-pp" order), which decides which groups leave the node: a group whose consecutive
members are `stride` ranks apart has gpus_per_node // stride members on each node.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """How a communication group of `size` ranks sits on the nodes."""

    size: int
    per_node: int
    """Members of the group that share a node."""

    @property
    def num_nodes(self) -> int:
        return self.size // self.per_node


def group_placement(size: int, stride: int, gpus_per_node: int) -> GroupPlacement:
    """Placement of a group whose consecutive members are `stride` ranks apart."""
    if size <= 1:
        return GroupPlacement(size=max(size, 1), per_node=max(size, 1))
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    while size % per_node:
        per_node -= 1
    return GroupPlacement(size=size, per_node=per_node)
