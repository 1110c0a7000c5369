"""The per-term record: for each backward whose loss is a sum of terms, what each term of
the sum was scaled by, and for each per-token log-prob selection (a loss built by hand
from ``log_softmax`` and ``gather``, or TRL's fused LM head) the weights the backward gave
its tokens. Read by the term rules (:mod:`._term_rules`); recorded by
:class:`~accumguard.observe._losses.LossRecorder` from the walk below each backward's root
(:mod:`._losses_walk`).

Two kinds of records go on the step event as ``terms``:

* ``["term", micro, ordinal, node, constants, means, opaque, site, order, rows, mean,
  backward, below, penalty]``:
  one term of a backward's sum (``ordinal``: its place in the walk, ``node``: the autograd
  node where it starts, ``constants``: ``["/", c]``/``["*", c]`` between it and the root,
  ``means``: element counts of the means above it, ``opaque``: a factor that could not be
  read, ``backward``: the backward's call site). ``site``/``order`` name the recorded loss call the term is (None for a term built
  from torch ops, an MoE router loss), ``rows`` that call's input rows, ``mean`` its
  reduction, ``below`` (a term from torch ops) the rows of the batch means that every
  path below it goes through (:func:`~._losses_walk.batch_means_below`), or None;
  ``penalty``: a term from torch ops on the parameters alone (:func:`~._losses_walk.
  params_only`: an L2 penalty, the same in every micro-step whatever the batch).
* ``["mean", micro, divisor, count, site, constants]``: a backward whose loss was built by
  hand as one mean over the elements of a tensor (``((out - y) ** 2).mean()``: no recorded
  loss call, no sum of terms) times constants only (``divisor``: their product, read from
  the graph as :func:`divisor` reads a term's; ``count``: the elements averaged, ``site``:
  the backward's call site, ``constants``: those constants, root first). That mean carries the weight ``1 / divisor``: the scale rules read
  a window's total weight from them as from the loss record (:mod:`._weight_rules`).
* ``["penalty", micro, constants, site]``: a backward whose root is a penalty on the
  parameters alone (:func:`~._losses_walk.params_only`) times ``constants``.
* ``["select", site, order, micro, n, seqs, divisor, uniform, sole, mean_rows]``: a selection's
  ``n`` tokens with a nonzero gradient (in ``seqs`` rows of its first dimension, 0 when
  it has one dimension), the product of the constants that divide it (``divisor``; None
  when a factor could not be read) and whether every token got the same gradient (then
  the selection is also a loss record, reduction ``'log-prob'``, judged like any loss);
  ``mean_rows``: when the first reduction from the root is a mean over the selection's rows
  (one value per sequence, ``per_seq.mean()``), that mean's count, else 0.

A selection's gradient is reduced on its device at the backward (count, sum, min and max of
the nonzero entries: a few element-wise passes over one value per token) and read on the
host once per optimizer step with the loss record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accumguard.observe._losses_walk import Const, Walk, batch_means_below, params_only

__all__ = ["FACTOR_TOL", "TermLog", "divisor", "factor_stats", "factor_uniform", "mean_rows",
           "selection_row", "selection_stats", "term_rows"]

#: "mean" records kept per window (as the loss record's calls: the recording stays bounded;
#: a longer window is not judged by them).
MAX_MEANS = 256
#: Relative spread under which a selection's nonzero per-token gradients are one weight
#: (the same value broadcast by the backward of a sum or a mean is bitwise equal).
UNIFORM_TOL = 1e-6
#: The same for weights read as gradient / factors (two roundings of fp32 products).
FACTOR_TOL = 1e-5


class TermLog:
    """The terms of each backward of the window, until the optimizer step."""

    def __init__(self) -> None:
        # per backward: (micro, [[node, constants, means, opaque, the recorded call, the
        # backward's site]])
        self.pending: list[tuple[int, list[list[Any]]]] = []
        self.means: list[list[Any]] = []  # the "mean" records of the window's backwards

    def clear(self) -> None:
        self.pending, self.means = [], []

    def on_walk(self, micro: int, w: Walk, calls: list[Any], site: Callable[[], str]) -> None:
        """Keep the terms of a backward whose root is a sum (every path walked), or its
        "mean" record when its root is one mean times constants; ``site``: the backward's
        call site (computed only then)."""
        if w.complete and len(w.leaves) == 1:
            x = w.leaves[0]
            if len(self.means) >= MAX_MEANS:
                return
            # (per-sample or per-token weights inside the mean are the user's weighting, not
            # judged: the mean's count and the constants above it are still its scale)
            if (x.first in ("mean", "mean1") and not (x.split or x.opaque or x.weighted_above)
                    and x.select is None
                    and type(x.node).__name__ != "AccumulateGrad"
                    and not any(c.node == x.node._sequence_nr() for c in calls)):
                d = divisor(x.divs, False)
                if d is not None and d > 0:
                    self.means.append(["mean", micro, d, int(x.means[0]), site(),
                                       [list(c) for c in x.divs]])
            elif (x.first != "mean" and not x.opaque and x.select is None
                  and type(x.node).__name__ != "AccumulateGrad"
                  and not any(c.node == x.node._sequence_nr() for c in calls)
                  and (x.penalty or params_only(x.node))):
                # a backward of a penalty on the parameters alone (``(coef * l2).backward()``
                # beside an engine's backward): its constants, for the rules that ask who
                # divided it by K
                self.means.append(["penalty", micro, [list(c) for c in x.divs], site()])
            return
        if not w.complete or len(w.leaves) < 2 or not any(x.split for x in w.leaves):
            return
        by_node = {c.node: c for c in calls if c.micro is None}
        where = site()
        descs = []
        for x in w.leaves:
            call = by_node.get(x.node._sequence_nr())
            name = type(x.node).__name__
            if call is None and x.msum is not None and x.msum in by_node:
                # the term below a masked sum recorded as a loss (_losses_walk.masked_sums)
                descs.append(["masked sum", x.divs, x.means, x.opaque, by_node[x.msum], where,
                              None, False])
                continue
            below = batch_means_below(x.node) \
                if call is None and x.select is None and not x.penalty else None
            penalty = x.penalty or (call is None and x.select is None and below is None
                                    and params_only(x.node))
            descs.append([name, x.divs, x.means, x.opaque, call, where, below, penalty])
        self.pending.append((micro, descs))


def selection_stats(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(n, -sum, [n, rows, sum, min, max])`` of the nonzero entries of the gradient
    reaching a selection (device tensors: nothing is read here)."""
    with torch.no_grad():
        nz = grad != 0
        n = nz.sum()
        rows = nz.reshape(grad.shape[0], -1).any(1).sum() if grad.dim() >= 2 \
            else torch.zeros_like(n)
        lo = torch.where(nz, grad, torch.full_like(grad, float("inf"))).min()
        hi = torch.where(nz, grad, torch.full_like(grad, float("-inf"))).max()
        s = grad.sum(dtype=torch.float64)
        stats = torch.stack([n.double(), rows.double(), s, lo.double(), hi.double()])
    return n, -s, stats


def factor_stats(grad: torch.Tensor, factors: list[torch.Tensor]) -> torch.Tensor | None:
    """The weights of a selection multiplied by data tensors (advantages, a 0/1 mask) on
    its way to the root: ``[counted, sum, min, max, read, distinct]`` (a device tensor;
    None when a factor does not broadcast to the selection's per-token shape).

    A factor whose values are all 0 or 1 is a mask: the *counted* tokens are those every
    mask keeps (and whose gradient is not zeroed by something else, a ``masked_fill``);
    among them a token is *read* where the product of all factors is nonzero, its weight
    ``|gradient / product|`` (an advantage of 0 hides a token's weight, not its count).
    ``distinct``: two rows (sequences: the first dimension) with read tokens have different
    counted lengths, so weights equal across them are not a per-sequence normalisation."""
    with torch.no_grad():
        dims = list(grad.shape)
        while dims and dims[-1] == 1:  # gather(...).squeeze(-1): the index's unit dimension
            dims.pop()
        aligned: list[torch.Tensor] = []
        for shape in (grad.shape, torch.Size(dims)):
            try:
                aligned = [torch.broadcast_to(f, shape) for f in factors]
            except RuntimeError:
                continue
            break
        if not aligned:
            return None
        shape = aligned[0].shape
        g = grad.reshape(shape).double()
        prod = torch.ones(shape, dtype=torch.float64, device=g.device)
        counted = torch.ones(shape, dtype=torch.bool, device=g.device)
        for f in aligned:
            fd = f.to(device=g.device, dtype=torch.float64)
            binary = ((fd == 0) | (fd == 1)).all()
            counted = counted & torch.where(binary, fd != 0, True)
            prod = prod * fd
        counted = counted & ~((prod != 0) & (g == 0))
        read = counted & (prod != 0)
        w = (g / torch.where(read, prod, 1.0)).abs()
        inf = torch.tensor(float("inf"), dtype=torch.float64, device=g.device)
        lo = torch.where(read, w, inf).min()
        hi = torch.where(read, w, -inf).max()
        total = torch.where(read, w, 0.0).sum()
        if len(shape) >= 2 and shape[0] > 0:
            per_row = counted.reshape(shape[0], -1).sum(1).double()
            has = read.reshape(shape[0], -1).any(1)
            rmax = torch.where(has, per_row, -inf).max()
            rmin = torch.where(has, per_row, inf).min()
            distinct = ((has.sum() >= 2) & (rmax > rmin)).double()
        else:
            distinct = torch.zeros((), dtype=torch.float64, device=g.device)
        return torch.stack([counted.sum().double(), total, lo, hi, read.sum().double(),
                            distinct])


def factor_uniform(stats: list[float]) -> float | None:
    """The one weight of a selection's read tokens (:func:`factor_stats`), or None when
    they differ (a per-sequence normalisation, token weights) or none was read."""
    _, total, lo, hi, read, _ = stats
    if read <= 0 or not hi > 0:
        return None
    if hi - lo > FACTOR_TOL * hi:
        return None
    return total / read


def divisor(divs: list[Const], opaque: bool) -> float | None:
    """The product of the constants dividing a term (a multiplication by ``c`` divides by
    ``1/c``); None when a factor could not be read."""
    if opaque:
        return None
    d = 1.0
    for op, c in divs:
        d = d * abs(float(c)) if op == "/" else d / abs(float(c))
    return d


def selection_row(site: str, idx: int, micro: int | None, divs: list[Const],
                  opaque: bool, sole: bool, stats: list[float], mean_rows: int = 0
                  ) -> list[Any] | None:
    """The ``select`` record of one selection, or None when no token had a gradient."""
    n, rows, _, lo, hi = stats
    if n <= 0 or micro is None:
        return None
    uniform = lo == hi or abs(hi - lo) <= UNIFORM_TOL * max(abs(hi), abs(lo))
    return ["select", site, idx, micro, int(n), int(rows), divisor(divs, opaque),
            bool(uniform), sole, int(mean_rows)]


def mean_rows(means: list[list[Any]], done: int) -> list[list[Any]]:
    """The ``mean`` records of the window's completed backwards."""
    return [r for r in means if int(r[1]) < done]


def term_rows(pending: list[tuple[int, list[list[Any]]]], keys: dict[int, tuple[str, int]],
              done: int) -> list[list[Any]]:
    """The ``term`` records of the window's completed backwards."""
    out: list[list[Any]] = []
    for micro, descs in pending:
        if micro >= done:
            continue
        for i, (name, divs, means, opaque, call, where, below, penalty) in enumerate(descs):
            key = keys.get(id(call)) if call is not None else None
            out.append(["term", micro, i, name, divs, means, opaque,
                        key[0] if key else None, key[1] if key else None,
                        int(call.rows) if key else 0, bool(call.mean) if key else False,
                        where, below, penalty])
    return out
