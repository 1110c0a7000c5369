"""The walk below a backward's root (read before the backward runs: it frees what the nodes
saved), shared by the loss record (:mod:`._losses`) and the per-term record
(:mod:`._losses_terms`).

From the root down through multiplications and divisions, casts, views, sums and means,
masking, and the additions of a sum of terms, each visited node gets the constants above
it (``["/", c]`` or ``["*", c]``) and whether an addition is above it. The nodes where the
walk stops are the *leaves*: the terms of the loss, each with its constants, the element
counts of the means above it (a term that is a mean over its micro-batch's rows), and
whether a one-element factor above it could not be read (a device tensor: then its scale
is unknown, *opaque*). A leaf that selects per-token log-probabilities (``log_softmax``
then ``gather``/``take_along_dim``, or a fused log-prob autograd Function such as TRL's
chunked LM head; TRL's ``selective_log_softmax``: ``gather`` of the logits minus their
``logsumexp``, or a stack of per-row ``log_softmax`` + ``gather``) is a *selection*: the
gradient reaching it is the per-token weights.

A selection multiplied by data tensors on its way to the root (advantages, a 0/1 mask: a
policy-gradient loss) keeps those tensors as its *factors* when every one of them multiplies
per-token values (nothing reduces a dimension above them, no data division, no expand):
the weight a token carries is then the gradient reaching it divided by the factors' product
(:func:`accumguard.observe._losses_terms.factor_stats`). A factor that cannot be aligned so
leaves the selection *weighted* only (its weights are not read).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Const", "Leaf", "Walk", "batch_means_below", "constant", "masked_sums", "params_only",
           "walk"]

#: One constant between a node and the root: ``["/", c]`` or ``["*", c]`` (a list: it goes
#: to the recording as JSON).
Const = list[str | float]

#: Nodes through which the root of a backward is a loss call's output times a constant.
LINEAR = ("MulBackward", "DivBackward", "NegBackward", "CloneBackward", "ToCopyBackward",
          "AliasBackward", "ViewBackward", "SqueezeBackward", "UnsqueezeBackward",
          "SumBackward", "MeanBackward", "ReshapeAliasBackward")
#: Nodes that only mask or move per-token values (their zeros are not counted): walked
#: through towards a selection, as if linear.
_PASS = ("MaskedFillBackward", "MaskedScatterBackward", "ExpandBackward")
#: DistributedDataParallel's pass-through Function on the forward's outputs (its backward
#: node's class name)
_DDP_SINK = "_DDPSinkBackward"
#: Nodes visited below a backward's root (a chain of constants, the terms of a sum).
NODES = 64
#: A custom autograd Function that returns per-token log-probabilities (TRL's fused LM
#: head: ``_ChunkedLogProbFunction``), by its backward node's class name.
_FUSED = re.compile(r"log_?probs?", re.IGNORECASE)


@dataclass
class Leaf:
    """A node where the walk stopped: one term of the loss (or a part of one)."""

    node: Any
    index: int  # which output of ``node`` the path reached
    divs: list[Const]
    split: bool  # an addition above it: one term of a sum
    means: list[int]  # element counts averaged by the means above it
    opaque: bool  # a one-element factor above it that could not be read
    select: str | None = None  # "gather" or "fused": a per-token log-prob selection
    weighted: bool = False  # multiplied or divided by a data tensor above it (advantages)
    # the data tensors multiplying it per token (advantages, a mask), None when a data
    # factor could not be divided out (a division, a reduction over a dimension above it)
    factors: list[torch.Tensor] | None = None
    # the first reduction from the root down to it: "mean" for a mean over all the elements
    # of a tensor of several (``x.mean()``), "mean1" for one over a tensor of one row (a
    # micro-batch of one element), "other" for any other sum or mean, "" for none
    first: str = ""
    # the sequence number of the first whole sum (``SumBackward0``) from the root down to it:
    # a masked sum ``(obj * mask).sum()`` recorded as a loss (:func:`masked_sums`) is linked
    # to the term below it by this
    msum: int | None = None
    # a data tensor multiplying it stands above the first reduction from the root (not a per-sample or
    # per-token weight inside a mean: the mean's own scale is then not the term's)
    weighted_above: bool = False
    # a sum of many terms on the parameters alone, read whole (:func:`_penalty_sum`)
    penalty: bool = False


@dataclass
class Walk:
    """What :func:`walk` read below one root."""

    chain: dict[int, tuple[list[Const], bool]] = field(default_factory=dict)
    # nodes below a division by a tensor of one value per row (``x.sum(1) / lengths``: each
    # sequence normalised by its own count): their tokens' weights are the rows' choice
    row_divided: set[int] = field(default_factory=set)
    leaves: list[Leaf] = field(default_factory=list)
    complete: bool = False  # every path ended at a leaf within :data:`NODES` nodes


def constant(node: Any) -> float | None:
    """The constant operand of a multiplication or division node: a saved one-element CPU
    tensor that needs no gradient (a Python number is saved as one; a device tensor is not
    read, that would wait for the device)."""
    for attr in ("_saved_other", "_saved_self"):
        try:
            t = getattr(node, attr)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(t, (int, float)):
            return float(t)
        if (isinstance(t, torch.Tensor) and not t.requires_grad and t.numel() == 1
                and t.device.type == "cpu"):
            return float(t)
    return None


def _unread(node: Any) -> bool:
    """A one-element factor of a multiplication/division that :func:`constant` could not
    read (on a device): its scale is unknown."""
    for attr in ("_saved_other", "_saved_self"):
        try:
            t = getattr(node, attr)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(t, torch.Tensor) and t.numel() == 1 and t.device.type != "cpu":
            return True
    return False


def _mean_count(node: Any) -> int | None:
    """Elements one mean node averages (``x.mean()``: all; ``x.mean(d)``: the sizes of
    ``d``)."""
    try:
        sizes = tuple(int(s) for s in node._saved_self_sym_sizes)
        dims = getattr(node, "_saved_dim", None)
    except (AttributeError, RuntimeError, TypeError):
        return None
    if dims is None or dims == ():
        return int(math.prod(sizes))
    try:
        return int(math.prod(sizes[int(d)] for d in dims))
    except (IndexError, TypeError):
        return None


#: Nodes searched below a term built from torch ops for the batch means it is made of.
BELOW = 32


def _below(node: Any, leaf: Callable[[Any], bool]) -> Iterator[Any]:
    """Each autograd node below ``node`` once, depth first, not descending past a node
    ``leaf`` accepts; past :data:`BELOW` nodes it yields None and ends (too large a graph
    to read as a term's)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > BELOW:
            yield None
            return
        yield n
        if not leaf(n):
            stack.extend(m for m, _ in n.next_functions if m is not None)


def _batch_mean(n: Any) -> bool:
    return type(n).__name__.startswith("MeanBackward") and bool(_batch_rows(n))


def batch_means_below(node: Any) -> list[int] | None:
    """The rows averaged by the means over the batch dimension that every path below
    ``node`` goes through before reaching a parameter (an MoE load-balancing loss: a sum of
    products of ``probs.mean(0)``), or None: a parameter reached without such a mean (a
    weight penalty), no such mean, or more than :data:`BELOW` nodes. A term made only of
    such means is a statistic of its micro-batch, whatever it computes from them."""
    rows: list[int] = []
    for n in _below(node, _batch_mean):
        if n is None or type(n).__name__ == "AccumulateGrad":
            return None
        if _batch_mean(n):
            rows.append(int(_batch_rows(n) or 0))
    return sorted(set(rows)) or None


#: Nodes read below an addition to tell a penalty summed over many parameters
#: (:func:`_penalty_sum`): a few nodes per parameter tensor of a large model.
PENALTY_SUM_NODES = 4096


def _penalty_sum(node: Any) -> bool:
    """``node`` (an addition) is a sum over many parameters of penalties on them alone
    (``total = total + (p - p0).pow(2).sum()`` in a loop over ``named_parameters()``), read
    breadth first so that a path into the data (a loss term beside the sum) ends the read
    early; at most :data:`PENALTY_SUM_NODES` nodes."""
    queue, seen, leaves = [node], {id(node)}, 0
    i = 0
    while i < len(queue):
        n = queue[i]
        i += 1
        name = type(n).__name__
        if name == "AccumulateGrad":
            leaves += 1
            continue
        if name not in _PENALTY_NODES or len(seen) > PENALTY_SUM_NODES:
            return False
        for m, _ in n.next_functions:
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                queue.append(m)
    return leaves > BELOW // 4


#: Element-wise and reducing nodes a penalty on the parameters is made of (``p.pow(2).sum()``,
#: ``p.norm()``, ``(p - p0).abs().sum()``); a node that mixes in data (a matmul, a
#: convolution, an embedding lookup, a double backward) is not among them.
_PENALTY_NODES = frozenset({
    "PowBackward0", "PowBackward1", "SumBackward0", "SumBackward1", "MeanBackward0",
    "MeanBackward1", "MulBackward0", "DivBackward0", "AddBackward0", "SubBackward0",
    "NegBackward0", "AbsBackward0", "SqrtBackward0", "NormBackward0", "NormBackward1",
    "LinalgVectorNormBackward0", "ViewBackward0", "ReshapeAliasBackward0",
    "UnsafeViewBackward0", "CloneBackward0", "ToCopyBackward0", "TBackward0",
    "TransposeBackward0", "SelectBackward0", "SliceBackward0"})


#: Products of two operands, a penalty's only when both are parameters (see params_only).
_PRODUCT_NODES = frozenset({"MmBackward0", "BmmBackward0", "MvBackward0", "DotBackward0"})


def params_only(node: Any) -> bool:
    """Every path below ``node`` reaches a parameter (``AccumulateGrad``) through element-wise
    and reducing nodes only, within :data:`BELOW` nodes: a penalty on the parameters, the same
    value in every micro-step whatever the batch (``l2 * sum(w.pow(2).sum() for w in ...)``)."""
    leaves, products = [], False
    for n in _below(node, lambda x: type(x).__name__ == "AccumulateGrad"):
        if n is None:
            return False
        name = type(n).__name__
        if name == "AccumulateGrad":
            leaves.append(n)
        elif name in _PRODUCT_NODES:
            # a product of parameters (``w @ w.T``, an orthogonality penalty): every operand
            # has a gradient path; data enters a product as an operand without one
            if any(m is None for m, _ in n.next_functions):
                return False
            products = True
        elif name not in _PENALTY_NODES:
            return False
    # below a product, every leaf must be a parameter: an input given requires_grad (an
    # adversarial perturbation) is a leaf too
    return bool(leaves) and (not products or all(
        isinstance(getattr(a, "variable", None), torch.nn.Parameter) for a in leaves))


def _batch_rows(node: Any) -> int | None:
    """The size of dimension 0 when a mean node averages over it (``x.mean(0)``,
    ``x.mean()``), else None."""
    try:
        sizes = tuple(int(s) for s in node._saved_self_sym_sizes)
        dims = getattr(node, "_saved_dim", None)
    except (AttributeError, RuntimeError, TypeError):
        return None
    if not sizes:
        return None
    if dims is None or dims == () or any(int(d) in (0, -len(sizes)) for d in dims):
        return sizes[0]
    return None


def _reaches(node: Any, prefix: str, depth: int) -> bool:
    """A node named ``prefix...`` within ``depth`` single-input steps below ``node`` (a
    stack's first input followed)."""
    for _ in range(depth):
        if type(node).__name__.startswith(prefix):
            return True
        nxt = [n for n, _ in node.next_functions if n is not None]
        if not nxt:
            return False
        node = nxt[0]
    return type(node).__name__.startswith(prefix)


def _selection(name: str, node: Any) -> str | None:
    if name.startswith("SubBackward0"):  # TRL selective_log_softmax: gather - logsumexp
        nxt = [n for n, _ in node.next_functions if n is not None]
        if (len(nxt) == 2 and type(nxt[0]).__name__.startswith("GatherBackward")
                and _reaches(nxt[1], "LogsumexpBackward", 4)):
            return "lse"
        return None
    if name.startswith("StackBackward"):  # the same, per row (bf16 logits)
        nxt = [n for n, _ in node.next_functions if n is not None]
        if nxt and all(_selection(type(n).__name__, n) == "gather" for n in nxt):
            return "stack"
        return None
    if name.startswith("GatherBackward"):
        nxt = [n for n, _ in node.next_functions if n is not None]
        if len(nxt) == 1 and type(nxt[0]).__name__.startswith("ExpandBackward"):
            nxt = [n for n, _ in nxt[0].next_functions if n is not None]
        if len(nxt) == 1 and type(nxt[0]).__name__.startswith("LogSoftmaxBackward"):
            return "gather"
        return None
    if name.endswith("Backward") and _FUSED.search(name) and hasattr(node, "_forward_cls"):
        return "fused"
    return None


def walk(root: torch.Tensor | Sequence[torch.Tensor], stops: frozenset[int] = frozenset()) -> Walk:
    """The chain, leaves and completeness below ``root`` (a tensor, or a one-tensor list);
    an empty walk when the graph is unusual (a tensor subclass). ``stops``: the sequence
    numbers of recorded loss calls' outputs, leaves wherever they are (a ``kl_div`` whose
    ``'batchmean'`` ends in a division is one term, not the nodes below it)."""
    out = Walk()
    try:
        _walk(root, out, stops)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return Walk()
    return out


def _unit_select(node: Any) -> bool:
    """An index into a dimension of size 1 (``gather(...)[..., 0]``): a squeeze, as linear
    as one; an index into a larger dimension is not walked through."""
    if not type(node).__name__.startswith("SelectBackward"):
        return False
    try:
        sizes = tuple(int(s) for s in node._saved_self_sym_sizes)
        return sizes[int(node._saved_dim)] == 1
    except (AttributeError, RuntimeError, TypeError, IndexError):
        return False


def _factor(node: Any) -> torch.Tensor | None:
    """The data operand of a multiplication whose other operand is on the path (the one
    input with a gradient), or None (a division, both operands on the path)."""
    pos = [i for i, (n, _) in enumerate(node.next_functions) if n is not None]
    if len(pos) != 1 or not type(node).__name__.startswith("MulBackward0"):
        return None
    t = getattr(node, "_saved_other" if pos[0] == 0 else "_saved_self", None)
    return t if isinstance(t, torch.Tensor) and not t.requires_grad else None


#: One node to visit: (node, output index, constants above, addition above, means above,
#: opaque above, a data factor above, the data factors above (None: not divisible), the
#: first reduction above (:attr:`Leaf.first`), the first whole sum above (:attr:`Leaf.msum`),
#: a data factor above the first reduction (:attr:`Leaf.weighted_above`), a division by
#: per-row values above (:attr:`Walk.row_divided`)).
_Item = tuple[Any, int, list[Const], bool, list[int], bool, bool,
              list[torch.Tensor] | None, str, int | None, bool, bool]
#: A reduction over some dimensions: data factors above it hold per-row values.
_DIM_REDUCE = ("SumBackward1", "MeanBackward1")


def _walk(root: torch.Tensor | Sequence[torch.Tensor], out: Walk, stops: frozenset[int]) -> None:
    if isinstance(root, (list, tuple)):
        if len(root) != 1:
            return
        root = root[0]
    fn = getattr(root, "grad_fn", None)
    if fn is None:
        return
    stack: list[_Item] = [(fn, 0, [], False, [], False, False, [], "", None, False, False)]
    for _ in range(NODES):
        if not stack:
            out.complete = True
            return
        node, index, divs, split, means, opaque, weighted, factors, first, msum, above, rowdiv = \
            stack.pop()
        name = type(node).__name__
        if name == _DDP_SINK:
            # DDP's identity on its forward's outputs (find_unused_parameters, the HF
            # Trainer's default): output i is tensor input i. One node for all the outputs
            # (a loss computed in the model, its logits), so walked per path, not marked seen.
            nf = node.next_functions
            if index < len(nf) and nf[index][0] is not None:
                stack.append((nf[index][0], nf[index][1], divs, split, means, opaque, weighted,
                              factors, first, msum, above, rowdiv))
            continue
        seq = node._sequence_nr()
        if seq in out.chain:
            continue
        out.chain[seq] = (divs, split)
        if rowdiv:
            out.row_divided.add(seq)
        nxt = [(n, i) for n, i in node.next_functions if n is not None]
        select = _selection(name, node)
        if seq in stops:
            out.leaves.append(Leaf(node, index, divs, split, means, opaque, None, weighted,
                                   None, first, msum, above))
            continue
        if select is None and name.startswith(("AddBackward0", "SubBackward0")) \
                and len(nxt) > 1:
            if any(type(n).__name__ == "AddBackward0" for n, _ in nxt) and _penalty_sum(node):
                # `total = total + (p - p0).pow(2).sum()` over every parameter: one term
                out.leaves.append(Leaf(node, index, divs, split, means, opaque, None, weighted,
                                       None, first, msum, above, penalty=True))
                continue
            # the terms (a sum above this addition is not any one term's)
            stack.extend((n, i, divs, True, means, opaque, weighted, factors, first, None, above,
                          rowdiv)
                         for n, i in nxt)
            continue
        if select is None and (name.startswith(LINEAR + _PASS) or _unit_select(node)) \
                and len(nxt) == 1:
            if name.startswith(("DivBackward", "MulBackward")):
                c = constant(node)
                if c is not None and c != 0.0:
                    divs = [*divs, ["/" if name.startswith("Div") else "*", c]]
                elif _unread(node):
                    opaque = True
                else:  # a tensor of values (advantages, a mask, per-sequence lengths)
                    weighted = True
                    above = above or not first
                    rowdiv = rowdiv or _row_divisor(node)
                    f = _factor(node)
                    factors = None if f is None or factors is None else [*factors, f]
            elif name.startswith("MeanBackward"):
                count = _mean_count(node)
                means = [*means, count] if count else means
                if not first:
                    first = "mean" if name == "MeanBackward0" and (count or 0) > 1 else \
                        "mean1" if name == "MeanBackward0" and _one_row(node) else "other"
            elif name.startswith("SumBackward") and not first:
                first = "other"
            if msum is None and name == "SumBackward0":
                msum = seq
            if factors and name.startswith(_DIM_REDUCE + ("ExpandBackward",)):
                factors = None  # per-row factors above a reduction: not per token here
            stack.append((nxt[0][0], nxt[0][1], divs, split, means, opaque, weighted,
                          factors, first, msum, above, rowdiv))
            continue
        out.leaves.append(Leaf(node, index, divs, split, means, opaque, select, weighted,
                               factors if weighted and select is not None else None, first,
                               msum, above))
    out.complete = not stack


def _one_row(node: Any) -> bool:
    """A mean over a tensor of one element with at least one dimension (a micro-batch of
    one row: ``losses.mean()`` of one pair), not over a 0-dim scalar."""
    try:
        sizes = tuple(int(x) for x in node._saved_self_sym_sizes)
    except (AttributeError, RuntimeError, TypeError):
        return False
    return len(sizes) >= 1 and math.prod(sizes) == 1


def _row_divisor(node: Any) -> bool:
    """A division by a tensor of values with at least one dimension (one per row)."""
    if not type(node).__name__.startswith("DivBackward0"):
        return False
    t = getattr(node, "_saved_other", None)
    return isinstance(t, torch.Tensor) and t.dim() >= 1 and t.numel() > 1


#: Nodes visited looking for masked sums below a backward's root (:func:`masked_sums`).
_MASKED_NODES = 32
#: Nodes between a backward's root and a masked sum: constants, casts, views, a negation.
_MASKED_CHAIN = ("MulBackward0", "DivBackward0", "NegBackward", "CloneBackward", "ToCopyBackward",
                 "AliasBackward", "ViewBackward", "SqueezeBackward", "UnsqueezeBackward",
                 "ReshapeAliasBackward")


def masked_sums(root: torch.Tensor | Sequence[torch.Tensor]) -> list[tuple[Any, torch.Tensor, bool]]:
    """``(sum node, mask, term)`` for each ``(x * mask).sum()`` that is the root times
    constants only (``term`` False: a loss built by hand over the tokens a 0/1 mask keeps, a
    policy-gradient or any per-token objective ``(obj * mask).sum() / n``) or one term of a
    sum of terms at the root (``term`` True: a PPO objective beside a KL penalty). The mask
    is the multiplication's data operand; whether it holds only 0 and 1 is decided on its
    device by the caller."""
    if isinstance(root, (list, tuple)):
        if len(root) != 1:
            return []
        root = root[0]
    out: list[tuple[Any, torch.Tensor, bool]] = []
    stack: list[tuple[Any, bool]] = [(getattr(root, "grad_fn", None), False)]
    try:
        for _ in range(_MASKED_NODES):
            if not stack:
                break
            node, term = stack.pop()
            if node is None:
                continue
            name = type(node).__name__
            nxt = [n for n, _ in node.next_functions if n is not None]
            if name == "SumBackward0" and len(nxt) == 1:
                below = nxt[0]
                if type(below).__name__.startswith("MulBackward0"):
                    mask = _factor(below)
                    if mask is not None and mask.dim() >= 1:
                        out.append((node, mask, term))
                continue
            if name.startswith(("AddBackward0", "SubBackward0")) and len(nxt) > 1:
                stack.extend((n, True) for n in nxt)  # the terms of a sum
                continue
            if not name.startswith(_MASKED_CHAIN) or len(nxt) != 1:
                continue
            if name.startswith(("MulBackward", "DivBackward")) and constant(node) is None \
                    and not _unread(node):
                continue  # a data tensor above the sum (a device scalar is read by the hook)
            stack.append((nxt[0], term))
    except (AttributeError, RuntimeError, TypeError):
        return []
    return out
