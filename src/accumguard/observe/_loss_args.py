"""What one torch loss call averaged or summed, read from its arguments (no host sync): the
valid count ``n``, whether ``'mean'`` divided by it, the grad node of its output, the rows of
its input and what ``n`` counts. The loss record (:mod:`._losses`) keeps one record per call
from these.

- ``cross_entropy`` / ``nll_loss``: class-index targets count the targets that are not
  ``ignore_index`` (tokens); with class ``weight=`` the valid targets' weights summed (a
  weighted mean divides by that: counted in units of class weight); probability targets
  count rows (samples), with class weights not read. The legacy ``size_average``/``reduce``
  flags make another mean: not read.
- The element-wise losses (``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``,
  ``binary_cross_entropy_with_logits``): ``'mean'`` divides by the broadcast element count;
  an element weight makes a weighted mean: not read.
- ``kl_div``: ``'batchmean'`` divides by the input's first dimension (the samples, as
  distillation losses use it), ``'mean'`` by its element count.
- ``ctc_loss``: counted in utterances (the batch dimension of ``log_probs``, 1 when
  unbatched); ``'mean'`` divides each utterance's loss by its target length, then averages
  over the utterances: the per-length factor is the same in the large batch, so each
  utterance weighs ``g / N`` here as it would there.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["ELEMENTWISE", "LOW", "Read", "read_class_loss", "read_ctc", "read_elementwise",
           "read_kl_div"]

#: the dtypes whose rounding the low-precision findings judge
LOW = (torch.float16, torch.bfloat16)
#: Element-wise losses: argument positions of (size_average, reduce, reduction, weight-like
#: arguments that make the mean a weighted one); None where the function has none.
ELEMENTWISE: dict[str, tuple[int | None, int | None, int, tuple[int, ...]]] = {
    "mse_loss": (2, 3, 4, (5,)),
    "l1_loss": (2, 3, 4, (5,)),
    "smooth_l1_loss": (2, 3, 4, ()),
    "huber_loss": (None, None, 2, (4,)),
    "binary_cross_entropy_with_logits": (3, 4, 5, (2, 6)),
}
_WEIGHT_NAMES = {2: "weight", 4: "weight", 5: "weight", 6: "pos_weight"}

#: (grad node, n, mean?, low precision?, rows, unit)
Read = tuple[Any, "torch.Tensor | int", bool, bool, int, str]


def read_class_loss(out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Read | None:
    """``cross_entropy``/``nll_loss`` (positional order: input, target, weight,
    size_average, ignore_index, reduce, reduction)."""
    na, get = len(args), kwargs.get
    if ((args[3] if na > 3 else get("size_average")) is not None
            or (args[5] if na > 5 else get("reduce")) is not None):
        return None  # the legacy reduction flags: not a plain mean/sum
    weight = args[2] if na > 2 else get("weight")
    ops = _operands(out, args, kwargs, 6)
    if ops is None:
        return None
    mean, inp, target, node = ops
    n: torch.Tensor | int
    unit = "tokens"
    if target.is_floating_point():  # probability targets: 'mean' divides by rows
        if weight is not None:
            return None
        n = inp.numel() // inp.shape[1] if inp.dim() >= 2 else 1
        unit = "samples"
    else:
        ignore = args[4] if na > 4 else get("ignore_index", -100)
        valid = target != ignore
        if weight is None:
            n = torch.count_nonzero(valid)
        elif isinstance(weight, torch.Tensor) and weight.dim() == 1:
            # class weights: a 'mean' divides by the valid targets' weights summed, and
            # each token carries its class's weight: counted in units of class weight
            with torch.no_grad():
                n = weight.detach()[target.masked_fill(~valid, 0)].masked_fill(~valid, 0).sum()
            unit = "class-weighted tokens"
        else:
            return None
    rows = inp.numel() // inp.shape[1] if inp.dim() >= 2 and inp.shape[1] else 1
    return node, n, mean, out.dtype in LOW or inp.dtype in LOW, rows, unit


def read_class_loss_none(out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
                         ) -> tuple[Any, torch.Tensor, torch.Tensor, bool, int] | None:
    """``cross_entropy``/``nll_loss`` with ``reduction='none'`` over class-index targets (a
    per-token loss the script reduces itself: ``ce.sum() * scale``, ``ce[mask].mean()``):
    (grad node, valid count, valid mask, low precision?, rows). Its tokens' weights are the
    gradient reaching the output at the valid positions (:meth:`LossRecorder._on_grad_none`).
    None for class weights, legacy flags, probability targets or another reduction."""
    na, get = len(args), kwargs.get
    if ((args[2] if na > 2 else get("weight")) is not None
            or (args[3] if na > 3 else get("size_average")) is not None
            or (args[5] if na > 5 else get("reduce")) is not None
            or (args[6] if na > 6 else get("reduction", "mean")) != "none"):
        return None
    inp = args[0] if na > 0 else get("input")
    target = args[1] if na > 1 else get("target")
    node = out.grad_fn
    if not isinstance(inp, torch.Tensor) or not isinstance(target, torch.Tensor) or node is None \
            or target.is_floating_point() or tuple(target.shape) != tuple(out.shape):
        return None
    ignore = args[4] if na > 4 else get("ignore_index", -100)
    with torch.no_grad():
        valid = target != ignore
        n = torch.count_nonzero(valid)
    rows = int(out.shape[0]) if out.dim() >= 1 else 1
    return node, n, valid, out.dtype in LOW or inp.dtype in LOW, rows


def read_elementwise(kind: str, out: torch.Tensor, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Read | None:
    """``mse_loss`` and its kin: ``'mean'`` divides by the broadcast element count."""
    i_avg, i_red, i_reduction, i_weights = ELEMENTWISE[kind]
    na, get = len(args), kwargs.get
    for i, name in ((i_avg, "size_average"), (i_red, "reduce")):
        if i is not None and (args[i] if na > i else get(name)) is not None:
            return None
    for i in i_weights:
        if (args[i] if na > i else get(_WEIGHT_NAMES[i])) is not None:
            return None  # a weighted mean: not one weight per element
    ops = _operands(out, args, kwargs, i_reduction)
    if ops is None:
        return None
    mean, inp, target, node = ops
    try:
        shape = torch.broadcast_shapes(inp.shape, target.shape)  # type: ignore[no-untyped-call]
    except RuntimeError:
        return None
    n = math.prod(shape)
    # the rows: the samples (or tokens) of the micro-batch, each a vector over the last
    # dimension ((8, 3) predictions: 8 rows), for a term averaged over the same rows
    rows = n // shape[-1] if len(shape) >= 2 and shape[-1] else n
    return node, n, mean, out.dtype in LOW or inp.dtype in LOW, rows, "elements"


def read_kl_div(out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Read | None:
    """``kl_div(input, target, size_average, reduce, reduction, log_target)``."""
    na, get = len(args), kwargs.get
    if (args[2] if na > 2 else get("size_average")) is not None \
            or (args[3] if na > 3 else get("reduce")) is not None:
        return None
    reduction = args[4] if na > 4 else get("reduction", "mean")
    inp = args[0] if na > 0 else get("input")
    node = out.grad_fn
    if not isinstance(inp, torch.Tensor) or node is None or inp.dim() == 0 \
            or reduction not in ("batchmean", "mean", "sum"):
        return None
    lp = out.dtype in LOW or inp.dtype in LOW
    if reduction == "mean":
        n = inp.numel()
        return node, n, True, lp, n // inp.shape[-1] if inp.dim() >= 2 else n, "elements"
    return node, inp.shape[0], reduction == "batchmean", lp, inp.shape[0], "samples"


def read_ctc(out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Read | None:
    """``ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction,
    zero_infinity)``: ``log_probs`` is ``(T, N, C)``, or ``(T, C)`` for one utterance."""
    na, get = len(args), kwargs.get
    reduction = args[5] if na > 5 else get("reduction", "mean")
    inp = args[0] if na > 0 else get("log_probs")
    node = out.grad_fn
    if not isinstance(inp, torch.Tensor) or node is None or inp.dim() not in (2, 3) \
            or reduction not in ("mean", "sum"):
        return None
    n = inp.shape[1] if inp.dim() == 3 else 1
    return node, n, reduction == "mean", out.dtype in LOW or inp.dtype in LOW, n, "samples"


def _operands(out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any],
              i_reduction: int) -> tuple[bool, torch.Tensor, torch.Tensor, Any] | None:
    """``(mean?, input, target, grad node)`` of a loss call with a plain ``'mean'`` or
    ``'sum'`` reduction (its position ``i_reduction``) and tensor operands, else None."""
    na, get = len(args), kwargs.get
    reduction = args[i_reduction] if na > i_reduction else get("reduction", "mean")
    if reduction not in ("mean", "sum"):
        return None
    inp = args[0] if na > 0 else get("input")
    target = args[1] if na > 1 else get("target")
    node = out.grad_fn
    if not isinstance(inp, torch.Tensor) or not isinstance(target, torch.Tensor) \
            or node is None:
        return None
    return reduction == "mean", inp, target, node
