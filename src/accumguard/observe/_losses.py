"""The loss record: per cross-entropy call, how many targets it averaged or summed and the
gradient the rest of the loss gave its output, so a window's per-token weights can be
compared without touching the user's code (the F5 rule of :mod:`accumguard.observe.rules`).

``torch.nn.functional.cross_entropy`` and ``nll_loss`` are patched where torch defines
them: ``nn.CrossEntropyLoss``, ``nn.NLLLoss`` and transformers' loss functions call them
by attribute at call time, and a script's ``from torch.nn.functional import
cross_entropy`` runs after ``watch`` installed the patch, so every alias is seen.

For each call whose output requires grad, with ``reduction`` ``'mean'`` or ``'sum'`` and
no class ``weight=``, the valid count ``n`` is kept as a device tensor (targets that are
not ``ignore_index`` for class-index targets; rows for probability targets: what torch's
``'mean'`` divides by) and a hook on the output keeps the scalar gradient ``g`` that the
rest of the loss gave it. Each of that call's tokens then weighs ``g / n`` (mean) or
``g`` (sum) in the gradient the optimizer receives: the F5 bug gives every micro-step's
call the same ``g`` whatever its ``n``. Nothing is read on the host until the optimizer
step (one transfer per window, and none when fewer than two micro-steps had a call).
Cost control: the first windows are always recorded, later ones while the record has cost
at most 0.5 % of the run's time (about 50 µs of Python per loss call and step on a CPU:
every window of a real model, some windows of a toy one). The cost counted is all of it:
the loss calls' records, the walk below each backward's root, the gradient hooks and the
step's transfer.

The element-wise regression losses (``mse_loss``, ``l1_loss``, ``smooth_l1_loss``,
``huber_loss``, ``binary_cross_entropy_with_logits``) are recorded the same way, their
``'mean'`` dividing by the element count: they carry the same per-window weights; so are
``kl_div`` and ``ctc_loss`` (counted in samples and utterances).

A call belongs to the backward pass whose gradient reached it (a loss computed and never
backpropagated records nothing). It is named by its call site: the first frame outside
torch and the training libraries (the user's line), plus its order among that site's calls
in the same backward. Two more facts go with each record (the scale rules of
:mod:`accumguard.observe.rules`):

- *sole*: the backward's root is that call's output times constants (a chain of
  multiplications, divisions, casts and views from the root down to the call), so its
  weight is the whole loss's weight: the root is remembered by a thin wrapper on
  ``torch.autograd.backward``, which every ``Tensor.backward``, ``engine.backward`` and
  ``accelerator.backward`` reaches.
- *via autograd.grad*: ``torch.autograd.grad`` of a loss with respect to parameters
  (no ``create_graph``: not a gradient penalty or a meta-gradient) is how some loops make
  their micro-step gradients and assign ``p.grad`` by hand; such a call counts as one
  micro-step of the record (numbered apart from the backward passes). Other
  ``autograd.grad`` calls (inputs that are not parameters, ``create_graph=True``) record
  nothing.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from accumguard.observe._failsafe import hook_method
from accumguard.observe._loss_args import (
    ELEMENTWISE,
    LOW,
    read_class_loss,
    read_class_loss_none,
    read_ctc,
    read_elementwise,
    read_kl_div,
)
from accumguard.observe._losses_terms import (
    TermLog,
    factor_stats,
    factor_uniform,
    mean_rows,
    selection_row,
    selection_stats,
    term_rows,
)
from accumguard.observe._losses_walk import Const, masked_sums, walk

if TYPE_CHECKING:
    from accumguard.observe._patch import Patches
    from accumguard.observe._seams import LossHost

__all__ = ["LossRecorder"]

#: Packages whose frames are skipped to name a call by the user's line.
_LIBRARIES = ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning",
              "lightning_fabric", "deepspeed", "peft", "trl", "accumguard")
#: Calls kept per window beyond which recording stops (a loop computing many losses
#: without backward must not grow memory); the rule then judges what was kept.
_MAX_CALLS = 4096
#: Records written per optimizer step (the recording's size stays bounded).
_MAX_RECORDS = 256
_FRAMES = 16
#: Frames never named as a call site, even when no user frame is within reach.
_OWN = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,) if m.__file__) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)
#: Windows always recorded, then windows are recorded while the record has cost at most
#: this fraction of the time since install (F5 shows in every window with uneven counts:
#: a model whose micro-steps take milliseconds is recorded on every window, a toy on some).
#: Four: a log-prob normaliser spanning two optimizer steps is proven by two such spans
#: (:mod:`._term_rules`), four consecutive windows, whatever the machine's load.
_ALWAYS = 4
_BUDGET = 0.005
def one_weight(gv: torch.Tensor, n: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one weight the gradient ``gv`` gives the valid tokens of a ``reduction='none'``
    call, and how many tokens carry it: the nonzero ones, since a mask multiplied in after
    the call (``(nll * mask).sum() / mask.sum()``) gives the masked ones 0 (all zero keeps
    ``n``). NaN when the nonzero values differ (per-token weights). No host sync: tensors."""
    nz = gv != 0
    cnt = nz.sum()
    some = cnt > 0
    g = torch.where(nz, gv, torch.zeros_like(gv)).sum() / cnt.clamp(min=1)
    hi = torch.where(nz, gv, torch.full_like(gv, float("-inf"))).max()
    lo = torch.where(nz, gv, torch.full_like(gv, float("inf"))).min()
    spread = torch.where(some, hi - lo, torch.zeros_like(g))
    g = torch.where(spread.abs() <= 1e-6 * g.abs(), g, torch.full_like(g, float("nan")))
    return g, torch.where(some, cnt, torch.as_tensor(n, device=cnt.device))


class _Call:
    """One recorded loss call; ``micro`` and ``g`` are set by the gradient hook."""

    __slots__ = ("chain_read", "divs", "factors", "fstats", "g", "grad", "lp", "masked", "mean",
                 "mean_rows",
                 "micro", "n", "node", "opaque", "rows", "seq", "site", "sole", "stats", "unit",
                 "weighted")

    def __init__(self, site: str, seq: int, n: torch.Tensor | int, mean: bool,
                 lp: bool, node: int, rows: int = 0, unit: str = "tokens") -> None:
        self.site = site
        # what ``n`` counts, for the findings' words: "tokens" (class-index targets, log-prob
        # selections), "samples" (probability targets), "elements" (mse_loss and its kin)
        self.unit = unit
        self.seq = seq
        self.n = n
        self.mean = mean
        self.lp = lp
        self.node = node  # the sequence number of the output's autograd node
        self.micro: int | None = None
        self.g: torch.Tensor | None = None
        self.sole = False  # the backward's root is this output times constants
        self.grad = False  # reached by a counted torch.autograd.grad, not a backward
        # the constants between this output and the root: ["/", c] or ["*", c]
        self.divs: list[Const] = []
        # the walk from the root reached this output through constants only (else ``divs``
        # is not known to be all of them: recorded as None)
        self.chain_read = False
        self.rows = rows  # the rows of the call's input (the micro-batch's samples/tokens)
        # a selection whose first reduction from the root is a mean over its rows (one value
        # per sequence: ``per_seq.mean()``): that mean's count, else 0
        self.mean_rows = 0
        # a log-prob selection (:mod:`._losses_terms`): [count, rows, sum, min, max] of the
        # nonzero per-token gradients, a device tensor until the step
        self.stats: torch.Tensor | None = None
        self.opaque = False  # a factor between the selection and the root was not read
        # data tensors multiply the selection (advantages): equal weights are no normalisation
        self.weighted = False
        # those tensors until the backward reaches it, then the weights read through them
        self.factors: list[torch.Tensor] | None = None
        self.fstats: torch.Tensor | None = None
        self.masked = ""  # a masked sum (LossRecorder._masked_sum): "whole" or "term"


class LossRecorder:
    """Installed by the :class:`~accumguard.observe.Observer`; its records go on the step
    event as ``losses`` (see :meth:`take`)."""

    def __init__(self, observer: LossHost) -> None:
        self.obs = observer
        self.failsafe = observer.failsafe  # the hooks' door (:func:`hook_method`)
        self.calls: list[_Call] = []
        self.micro = 0  # backward passes since the last applied optimizer step
        self.gmicro = 0  # counted torch.autograd.grad calls since then
        self.prev_micros = 0  # micro-steps with a record in the last window taken
        self.root: object = None  # the tensor(s) of the backward running now
        # seq nr of each node below the root through constants and sums -> (the constants
        # above it, an addition above it)
        self.chain: dict[int, tuple[list[Const], bool]] = {}
        self.row_divided: set[int] = set()  # (the walk's: :attr:`._losses_walk.Walk.row_divided`)
        self.in_grad = False  # inside a counted torch.autograd.grad
        self.seq = 0
        self._lib_cache: dict[str, bool] = {}
        self.on = True  # record this window's calls (decided at each applied step)
        self.windows = 0  # applied steps seen
        self.spent = 0.0  # seconds spent recording
        self._t0 = time.perf_counter()
        self.terms = TermLog()  # the terms of each backward's loss, the log-prob selections
        self.term_records: list[list[Any]] | None = None
        self.done_last = -1  # backward passes the window last taken covered (-1: none taken)

    def install(self, patches: Patches) -> None:
        import torch.nn.functional as F  # noqa: N812 - torch's own alias

        for name in ("cross_entropy", "nll_loss"):
            patches.wrap(F, name, self._wrapper)
        for name in (*ELEMENTWISE, "kl_div", "ctc_loss"):
            patches.wrap(F, name, functools.partial(self._wrapper, kind=name))
        patches.wrap(torch.autograd, "backward", self._backward_root)
        patches.wrap(torch.autograd, "grad", self._grad_wrapper)
        self._t0 = time.perf_counter()

    def _backward_root(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """Remember the root of the running backward (for *sole*, see the module doc)."""
        rec = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.on or rec.root is not None:
                return orig(tensors, *args, **kwargs)
            t = time.perf_counter()
            rec._walk(tensors, backward=True)
            rec.spent += time.perf_counter() - t  # the walk is the record's cost too
            rec.root = tensors
            try:
                return orig(tensors, *args, **kwargs)
            finally:
                rec.root, rec.chain, rec.row_divided = None, {}, set()

        # (the door's short cut: the first test above)
        backward.passes = lambda: not rec.on or rec.root is not None  # type: ignore[attr-defined]
        return backward

    def _grad_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """Count ``torch.autograd.grad`` of a loss with respect to parameters (no
        ``create_graph``) as a micro-step of the record."""
        rec = self

        def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            # retain_graph: a backward of the same loss follows (an adaptive loss weight)
            if (not rec.on or rec.in_grad or rec.root is not None
                    or kwargs.get("create_graph") or (len(args) > 2 and args[2])
                    or kwargs.get("retain_graph") or (len(args) > 1 and args[1])
                    or not rec.obs._active()):
                return orig(outputs, inputs, *args, **kwargs)
            if not isinstance(inputs, (torch.Tensor, tuple, list)):
                try:  # a generator (model.parameters()): read it once, pass the same items on
                    inputs = tuple(inputs)
                except TypeError:
                    return orig(outputs, inputs, *args, **kwargs)
            params = [inputs] if isinstance(inputs, torch.Tensor) else inputs
            counted = bool(params) and all(isinstance(p, torch.nn.Parameter) for p in params)
            if not counted:
                return orig(outputs, inputs, *args, **kwargs)
            t = time.perf_counter()
            rec._walk(outputs)
            rec.spent += time.perf_counter() - t
            rec.in_grad, rec.root = True, outputs
            try:
                out = orig(outputs, inputs, *args, **kwargs)
            finally:
                rec.in_grad, rec.root, rec.chain, rec.row_divided = False, None, {}, set()
            rec.gmicro += 1  # counted once the call succeeded
            return out

        return grad

    # -- the observer's calls ---------------------------------------------------------------
    def end_backward(self) -> None:
        self.micro += 1

    def take(self, applied: bool, *, carry: bool = True) -> list[list[Any]] | None:
        """The window's records ``[site, order, micro, n, weight, low_precision, reduction]``
        at an applied optimizer step (``micro`` 0-based in the window, no-op steps folded
        in as the rules fold them), or None when there is nothing to compare. A step that
        changed nothing keeps the calls for the window that goes on (``carry``), unless
        its gradients were discarded (DeepSpeed's overflow skip: ``carry=False``): then
        the folded window has no record for its first micro-steps and is not judged."""
        if not applied:
            self.done_last = -1
            if not carry:
                self.calls = [c for c in self.calls if c.g is None]  # forwards to come
                self.micro = self.gmicro = 0
                self.terms.clear()
            return None
        t = time.perf_counter()
        try:
            return self._records()
        finally:
            now = time.perf_counter()
            self.spent += now - t
            self.windows += 1
            self.on = self.windows < _ALWAYS or self.spent <= _BUDGET * (now - self._t0)

    def _records(self) -> list[list[Any]] | None:
        self.term_records = None
        calls = [c for c in self.calls if c.g is not None and c.micro is not None]
        done = self.micro  # backward passes completed in the window
        self.done_last = done
        self.calls = []
        self.micro = self.gmicro = 0
        micros = len({(c.grad, c.micro) for c in calls})
        prev = self.prev_micros
        if micros:  # a step with no loss call (another optimizer's, same boundary) keeps it
            self.prev_micros = micros
        pending, means = self.terms.pending, mean_rows(self.terms.means, done)
        self.terms.clear()
        # a loss built by hand (no loss call) still has its "mean" records, and the terms
        # of its sum (a PPO loss: policy, value and entropy means)
        self.term_records = ([] if calls else term_rows(pending, {}, done)) + means or None
        # one micro-step says nothing about F5; it is kept when it can be a short last
        # window after windows of several (F7), one autograd.grad step (F1), or on
        # several ranks (the loss-weight ledger judges a window of one across ranks)
        if micros < 2 and not (micros and (prev >= 2 or any(c.grad for c in calls)
                                           or _distributed())):
            return None
        calls.sort(key=lambda c: (c.grad, c.micro, c.seq))
        try:  # one stack per kind, then to the host (one sync for the window on a GPU)
            with torch.no_grad():
                counts = [c.n for c in calls if not isinstance(c.n, int)]
                n_iter = iter(torch.stack(counts).tolist() if counts else [])
                g_list = [c.g for c in calls]
                if len({g.dtype for g in g_list}) > 1:  # type: ignore[union-attr]
                    g_list = [g.double() for g in g_list]  # type: ignore[union-attr]
                gs = torch.stack(g_list).tolist()  # type: ignore[arg-type]
                st = [c.stats for c in calls if c.stats is not None]
                s_iter = iter(torch.stack(st).tolist() if st else [])
                ft = [c.fstats for c in calls if c.fstats is not None]
                fstats = dict(zip([id(c) for c in calls if c.fstats is not None],
                                  torch.stack(ft).tolist() if ft else [], strict=True))
        except (RuntimeError, TypeError, ValueError):  # mixed devices/dtypes, subclasses
            return None
        ns = [float(c.n) if isinstance(c.n, int) else float(next(n_iter)) for c in calls]
        proven = _token_level(calls, fstats)
        vals = [ns, [float(g) for g in gs]]
        order: dict[tuple[int, str], int] = {}
        keys: dict[int, tuple[str, int]] = {}  # id(call) -> (site, order)
        out: list[list[Any]] = []
        sel: list[list[Any]] = []
        for c, n, g in zip(calls, vals[0], vals[1], strict=True):
            if c.masked == "term" and (n <= 0 or any(str(op) == "/" and float(d) == n
                                                     for op, d in c.divs)):
                continue  # not 0/1, or a per-micro-batch masked mean (a term from torch ops)
            key = (c.grad, c.micro, c.site)
            idx = order.get(key, 0)  # type: ignore[arg-type]
            order[key] = idx + 1  # type: ignore[index]
            keys[id(c)] = (c.site, idx)
            uniform = True
            if c.stats is not None:
                row = selection_row(c.site, idx, c.micro, c.divs, c.opaque, c.sole,
                                    next(s_iter), c.mean_rows)
                if row is None:
                    continue
                sel.append(row)
                uniform = bool(row[7]) and not c.weighted
                fs = fstats.get(id(c))
                if c.weighted and fs is not None and c.site in proven:
                    # the weights read through the data factors (advantages, a mask)
                    one = factor_uniform(fs)
                    if one is not None and fs[0] > 0:
                        out.append([c.site, idx, c.micro, int(fs[0]), one, c.lp, "log-prob",
                                    c.sole, c.grad, c.divs, "tokens"])
                    continue
            if n <= 0 or g == 0 or g != g or not uniform or (c.stats is None and c.weighted):
                continue  # nothing averaged, the loss did not reach the optimizer, a
                # selection whose tokens carry data-dependent weights (advantages), or a
                # loss whose rows were each divided by their own count (a per-sample mean:
                # its tokens' equal weights inside one micro-batch are a coincidence of
                # equal row lengths, not a per-micro-batch token mean)
            out.append([c.site, idx, c.micro, n if c.unit == "class-weighted tokens" else int(n),
                        g / n if c.mean else g, c.lp,
                        ("log-prob" if c.stats is not None else "mean") if c.mean else "sum",
                        c.sole, c.grad, c.divs if c.chain_read else None,
                        "tokens" if c.stats is not None else c.unit,
                        int(c.rows), *(["masked sum"] if c.masked else [])])
            if len(out) >= _MAX_RECORDS:
                break
        self.term_records = sel + term_rows(pending, keys, done) + means or None
        return out or None

    def take_terms(self) -> list[list[Any]] | None:
        """The term and selection records of the window last taken (:mod:`._losses_terms`),
        once."""
        out, self.term_records = self.term_records, None
        return out

    def reset(self) -> None:
        self.calls = []
        self.terms.clear()
        self.micro = self.gmicro = 0

    # -- the patch ------------------------------------------------------------------------
    def _wrapper(self, orig: Callable[..., Any], kind: str | None = None
                 ) -> Callable[..., Any]:
        rec = self
        reader = None if kind is None else read_kl_div if kind == "kl_div" \
            else read_ctc if kind == "ctc_loss" else functools.partial(read_elementwise, kind)
        record = rec._record if reader is None else functools.partial(rec._record_read, reader)

        def loss_fn(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if torch.compiler.is_compiling():
                return out  # first: under torch.compile nothing below may be traced
            obs = rec.obs
            if (not rec.on or not obs._active() or not obs._handlers.on_step
                    or not isinstance(out, torch.Tensor) or not out.requires_grad
                    or (out.dim() != 0 and kind is not None) or len(rec.calls) >= _MAX_CALLS):
                return out  # (a class loss's per-token output: reduction='none', read apart)
            t = time.perf_counter()
            record(out, args, kwargs)
            rec.spent += time.perf_counter() - t
            return out

        # (the door's short cut: a window the record skips calls straight through)
        loss_fn.passes = lambda: not rec.on  # type: ignore[attr-defined]
        return loss_fn

    def _record(self, out: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if out.dim() != 0:
            none = read_class_loss_none(out, args, kwargs)
            if none is not None:
                node, n, valid, lp, rows = none
                call = _Call(self._site(), self.seq, n, False, lp, node._sequence_nr(), rows)
                self.seq += 1
                self.calls.append(call)
                node.register_prehook(functools.partial(self._on_grad_none, call, valid, out.output_nr))
            return
        got = read_class_loss(out, args, kwargs)  # kept lean: it runs per loss call
        if got is not None:
            self._add(out, *got)

    def _record_read(self, reader: Callable[..., Any], out: torch.Tensor,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        got = reader(out, args, kwargs)
        if got is not None:
            self._add(out, *got)

    def _add(self, out: torch.Tensor, node: Any, n: torch.Tensor | int, mean: bool,
             lp: bool, rows: int = 0, unit: str = "tokens") -> None:
        call = _Call(self._site(), self.seq, n, mean, lp, node._sequence_nr(), rows, unit)
        self.seq += 1
        self.calls.append(call)
        # a pre-hook on the loss's autograd node: the gradient of its output, once per
        # backward that reaches it (cheaper than Tensor.register_hook)
        node.register_prehook(functools.partial(self._on_grad, call, out.output_nr))

    @hook_method
    def _on_grad(self, call: _Call, index: int, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        obs = self.obs
        grad = grad_outputs[index] if index < len(grad_outputs) else None
        via = self.in_grad
        if (obs._bw_current is None and not via) or not obs.installed or grad is None:
            return  # another torch.autograd.grad, or a backward the observer did not see
        t = time.perf_counter()
        micro = self.gmicro if via else self.micro
        if call.micro is None:
            call.micro, call.grad = micro, via
            call.g = grad.detach()
            call.sole = self._sole(call)
        elif call.micro == micro and call.grad == via and call.g is not None:
            call.g = call.g + grad.detach()
            call.sole, call.divs, call.chain_read = False, [], False
        else:  # backpropagated in two backward passes (retain_graph): no single weight
            call.g = None
        self.spent += time.perf_counter() - t

    @hook_method
    def _on_grad_none(self, call: _Call, valid: torch.Tensor, index: int,
                      grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        """The per-token gradient reaching a ``reduction='none'`` class loss: when it is one
        value at every valid token (a sum times constants, a mean over the valid tokens),
        the call weighs its tokens that value, as a ``'sum'`` call would; otherwise (per-token
        or per-sequence weights) no single weight, NaN, and the call is not recorded."""
        obs = self.obs
        grad = grad_outputs[index] if index < len(grad_outputs) else None
        if obs._bw_current is None or self.in_grad or not obs.installed or grad is None \
                or tuple(grad.shape) != tuple(valid.shape):
            return
        t = time.perf_counter()
        if call.micro is not None:  # reached by two backward passes: no single weight
            call.g = None
            return
        with torch.no_grad():
            gv = grad.detach()[valid]
            if gv.numel() == 0:
                g = torch.zeros((), dtype=grad.dtype, device=grad.device)
            else:
                g, call.n = one_weight(gv, call.n)
        call.micro, call.grad, call.g = self.micro, False, g
        call.sole = self._sole(call)
        self.spent += time.perf_counter() - t

    def _sole(self, call: _Call) -> bool:
        """Is the running backward's root the output of the call's node times constants?
        Keeps the constants between the call and the root (``["/", c]``, ``["*", c]``) in
        ``call.divs``, also for a call that is one term of a sum (then not sole): the
        ledger's evidence of a division by the world size, or of a user's coefficient."""
        entry = self.chain.get(call.node)
        if entry is None:
            return False
        call.divs, call.chain_read = entry[0], True
        if call.node in self.row_divided:
            call.weighted = True  # each row divided by its own count: the rows' weights
        return not entry[1]

    def _walk(self, root: Any, backward: bool = False) -> None:
        """The nodes from the root of the backward about to run (:mod:`._losses_walk`);
        for a backward pass (not a counted ``autograd.grad``), its terms and log-prob
        selections are recorded too (:mod:`._losses_terms`)."""
        w = walk(root, frozenset(c.node for c in self.calls if c.micro is None))
        self.chain, self.row_divided = w.chain, w.row_divided
        if not backward or not w.leaves or not self.obs._active():
            return
        site: list[str] = []

        def where() -> str:  # _site <- where <- _walk <- the backward's wrapper
            if not site:  # a Trainer's backward is deep below the user's line
                site.append(self._site(3, 4 * _FRAMES))
            return site[0]

        if not any(leaf.select for leaf in w.leaves) and len(self.calls) < _MAX_CALLS \
                and not any(c.node in w.chain for c in self.calls):
            self._masked_sum(root, where)
        for leaf in w.leaves:
            if leaf.select is None or len(self.calls) >= _MAX_CALLS:
                continue
            call = _Call(where(), self.seq, 0, True, False, leaf.node._sequence_nr())
            call.opaque, call.weighted = leaf.opaque, leaf.weighted
            call.mean_rows = int(leaf.means[0]) if leaf.first == "mean" and leaf.means else 0
            call.factors = leaf.factors or None
            self.seq += 1
            self.calls.append(call)
            leaf.node.register_prehook(functools.partial(self._on_select, call, leaf.index))
        self.terms.on_walk(self.micro, w, self.calls, where)

    def _masked_sum(self, root: Any, where: Callable[[], str]) -> None:
        """``(x * mask).sum()`` times constants, the whole loss or one term of it (a PPO
        objective, no loss call reached), recorded as a ``reduction='sum'`` call over the
        tokens its 0/1 mask keeps (dropped at the step when the mask is not 0/1, or when a
        term is divided by its own count: the term rules read that as a term from torch ops)."""
        for node, mask, term in masked_sums(root):
            if len(self.calls) >= _MAX_CALLS:
                return
            with torch.no_grad():
                binary = ((mask == 0) | (mask == 1)).all()
                n = torch.where(binary, torch.count_nonzero(mask), -1)
            rows = int(mask.shape[0]) if mask.dim() >= 1 else 1
            call = _Call(where(), self.seq, n, False, mask.dtype in LOW, node._sequence_nr(),
                         rows)
            call.masked = "term" if term else "whole"
            self.seq += 1
            self.calls.append(call)
            node.register_prehook(functools.partial(self._on_grad, call, 0))

    @hook_method
    def _on_select(self, call: _Call, index: int, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        """The gradient reaching a per-token log-prob selection: its nonzero entries are the
        tokens' weights (kept on the device until the step)."""
        obs = self.obs
        grad = grad_outputs[index] if index < len(grad_outputs) else None
        if (obs._bw_current is None or self.in_grad or not obs.installed
                or not isinstance(grad, torch.Tensor) or grad.numel() == 0):
            return
        if call.micro is not None:  # reached by two backward passes: no single weight
            call.g = None
            return
        t = time.perf_counter()
        call.micro, call.lp = self.micro, grad.dtype in LOW
        if call.mean_rows and (grad.dim() < 2 or int(grad.shape[0]) != call.mean_rows):
            call.mean_rows = 0  # the mean was not over the selection's rows
        call.n, call.g, call.stats = selection_stats(grad.detach())
        if call.factors:
            call.fstats = factor_stats(grad.detach(), call.factors)
        call.factors = None  # the saved tensors are not kept past the backward
        call.sole = self._sole(call)
        self.spent += time.perf_counter() - t

    # -- naming the call ----------------------------------------------------------------------
    def _site(self, depth: int = 3, frames: int = _FRAMES) -> str:
        """``path:line`` of the first frame outside the training libraries (else the first
        outside torch and accumguard within reach: a Trainer's line)."""
        f: FrameType | None = sys._getframe(depth)  # _site <- _record <- loss_fn <- caller
        first: str | None = None
        for _ in range(frames):
            if f is None:
                break
            fn = f.f_code.co_filename
            lib = self._lib_cache.get(fn)
            if lib is None:
                lib = self._lib_cache[fn] = self._is_library(fn)
            if not lib:
                return f"{fn}:{f.f_lineno}"
            if first is None and not fn.startswith(_OWN):
                first = f"{fn}:{f.f_lineno}"
            f = f.f_back
        return first or "?"

    @staticmethod
    def _is_library(filename: str) -> bool:
        for name in _LIBRARIES:
            mod = sys.modules.get(name)
            path = getattr(mod, "__file__", None)
            if path and filename.startswith(os.path.dirname(path) + os.sep):
                return True
        return filename.startswith("<frozen")


def _token_level(calls: list[_Call], fstats: dict[int, list[float]]) -> set[str]:
    """Call sites whose weights read through data factors are one weight per token in some
    micro-step across sequences of different lengths: their normaliser counts tokens, not
    sequences (a per-sequence mean gives a short sequence's tokens more weight), so equal
    weights within a micro-step are the loss's per-token weight."""
    out: set[str] = set()
    for c in calls:
        fs = fstats.get(id(c))
        if fs is not None and fs[5] > 0 and factor_uniform(fs) is not None:
            out.add(c.site)
    return out


def _distributed() -> bool:
    """Several ranks in the default process group."""
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
