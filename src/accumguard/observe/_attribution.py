"""Attribution: does a backward pass reach the output of a watched module's forward?

The guard counts only its model's backwards (a GAN's discriminator loss, an auxiliary
model's backward are not micro-steps of the model it guards). The observer hands this
class each root forward's output (:meth:`Attribution.note_output`) and asks, at each
backward, whether the loss's graph reaches one of those outputs (:meth:`Attribution.reaches`).

No hook is placed at forward time: the autograd nodes of the roots' outputs are remembered
by sequence number, and a short breadth-first walk of the loss's graph looks for them. A
node's inputs were created before it (smaller sequence number), so branches older than
every root output are pruned; the walk from a loss computed from the model's output is a
handful of nodes. Beyond ``WALK_LIMIT`` nodes (another model's large graph) it falls back to
a pre-hook on the latest forward's output nodes, which calls ``on_reach`` when the backward
gets there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accumguard.observe._introspect import grad_fns

__all__ = ["Attribution"]

# Root-output sequence numbers kept (between MAX_ROOT_SEQS and twice as many: trimmed in
# chunks), graph nodes walked before the pre-hook fallback, and the sequence number of
# nodes without one (leaves).
MAX_ROOT_SEQS = 64
WALK_LIMIT = 64
_NO_SEQ = 1 << 63


class Attribution:
    """The roots' recent output nodes, and the walk that finds them from a loss.

    Args:
        on_reach: called (with the gradients) when a fallback pre-hook fires: the backward
            running now reached a root's output.
    """

    def __init__(self, on_reach: Callable[[Any], None]) -> None:
        self._on_reach = on_reach
        self.reset()

    def reset(self) -> None:
        """Forget every output (no reference to the user's graph is kept)."""
        self._seqs: list[int] = []
        self._targets: set[int] = set()  # the same numbers, for the walk's lookups
        self._floor = _NO_SEQ  # the smallest of them: older branches are pruned
        # the latest forward's nodes (hooked only when the walk gives up; released when the
        # next root forward begins, so no graph is kept alive beside the one being built)
        self._nodes: list[Any] = []
        self._unknown = False  # a root forward whose output had no autograd node

    def forward_begins(self) -> None:
        self._nodes = []

    def note_output(self, output: Any) -> None:
        """Remember the autograd nodes of a root's output (any output type: tensors found in
        containers and in plain objects such as ``SimpleNamespace(loss=...)``)."""
        if isinstance(output, torch.Tensor):
            node = output.grad_fn
            nodes = [node] if node is not None else []
        else:
            nodes = grad_fns(output)
        if not nodes:
            self._unknown = True  # unknown: the next backward counts as the root's
            return
        self._nodes = nodes
        seqs, targets = self._seqs, self._targets
        for n in nodes:
            seq = n._sequence_nr()
            seqs.append(seq)
            targets.add(seq)
            if seq < self._floor:
                self._floor = seq
        if len(seqs) > 2 * MAX_ROOT_SEQS:  # trimmed in chunks: the set and floor are rebuilt
            del seqs[:-MAX_ROOT_SEQS]
            self._targets = set(seqs)
            self._floor = min(seqs)

    def reaches(self, tensors: Any) -> bool | None:
        """Does the backward of ``tensors`` reach a root's output? None: unknown (the last
        root forward's output had no autograd node); False may turn True while the backward
        runs (the fallback pre-hook calls ``on_reach``)."""
        if self._unknown:
            self._unknown = False
            return None
        seqs = self._seqs
        if not seqs:
            return False
        targets = self._targets
        if isinstance(tensors, torch.Tensor):
            node = tensors.grad_fn
            if node is None:
                return False
            if node._sequence_nr() in targets:
                return True  # the loss is a root's output (an HF-style model)
            queue = []
            for nxt, _ in node.next_functions:  # (loops, not comprehensions: no frame each)
                if nxt is not None:
                    queue.append(nxt)
        else:
            queue = [t.grad_fn for t in tensors
                     if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        floor = self._floor
        seen: set[int] = set()
        i = 0
        while i < len(queue):
            node = queue[i]
            i += 1
            seq = node._sequence_nr()
            if seq in targets:
                return True
            if seq < floor or seq >= _NO_SEQ or seq in seen:
                continue  # older than every root output, a leaf, or already walked
            seen.add(seq)
            if len(seen) > WALK_LIMIT:
                for root_node in self._nodes:
                    root_node.register_prehook(self._on_reach)
                self._nodes = []
                return False
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    queue.append(nxt)
        return False
