"""AG123 (F10) is below: a loss divided by a count summed over every rank, under the
wrapper's own average over ranks.

AG122 (LOSS_SCALE): a hand-written window (or Lightning's manual optimisation, or Fabric)
that backwards a mean loss K times and never divides by K.

Each micro-batch's mean loss is backwarded as is, so the window's gradient is the sum of K
means: K times the large batch's mean gradient (with SGD, K times the learning rate).
Judged only when everything is in sight and plain: a torch ``.backward()``,
``manual_backward`` or ``fabric.backward`` (not DeepSpeed's, Accelerate's or Lightning's
automatic optimisation, which divide by their own K), a window that accumulates with a
K named like one, a loss that is a mean (a torch loss function or a mean-reducing loss
module with its default reduction, ``.mean()``, a model output's ``.loss``) reaching the
backward with no arithmetic on the way, and no division by K anywhere in the file (a
helper, the learning rate, the gradients or FSDP2's ``set_gradient_divide_factor`` may carry
it). A sum-reducing loss is a constant the user chose: not judged.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import (
    division,
    flows_to_backward,
    is_loss_division,
    mean_criteria,
    reduction,
)
from accumguard.static.lint.families._masked import counted_per_micro_batch, num_items_arg
from accumguard.static.lint.families._rankavg import (
    custom_rank_reduction,
    hand_average,
    summed_over_ranks,
)
from accumguard.static.lint.families.deepspeed import _local_funcs, _name_values, _plain_loss
from accumguard.static.lint.families.fsdpfactor import resolved_factor

__all__ = ["global_count_then_ddp_average", "loss_divisions_by_rank_sum",
           "mean_loss_never_divided_by_k"]

_MEAN_FUNCS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
               "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
               "kl_div", "soft_margin_loss", "multi_margin_loss"}
_SCALING = {"div", "div_", "true_divide", "divide"}


def _k_scales_something(ctx: FileContext, k_names: frozenset[str] = frozenset()) -> bool:
    """K divides something anywhere in the file (``x / K``, ``x /= K``, ``x * (1 / K)``,
    ``.div_(K)``): the loss, the learning rate or the gradients may carry the 1/K, so the
    rule stays silent. K is a name that says accumulation, or one of ``k_names`` (what a
    window's boundary reads K from). (``step * K + micro`` indexes batches and ``n // K``
    counts steps: neither scales.)"""
    def is_k(side: ast.AST) -> bool:
        return ctx.mentions_accum(side) or any(dotted(x) in k_names for x in walk_all(side))

    def compute() -> bool:
        for n in ctx.of(ast.BinOp, ast.AugAssign):
            if isinstance(n.op, ast.Div):
                sides = (n.left, n.right) if isinstance(n, ast.BinOp) else (n.target, n.value)
                if any(is_k(s) for s in sides):
                    return True
        return any(call_attr(call) in _SCALING and any(is_k(a) for a in call.args)
                   for call in ctx.of(ast.Call))
    return bool(ctx._cached("k_scales:" + ",".join(sorted(k_names)), ctx.tree, compute))


def _is_mean(ctx: FileContext, scope: ast.AST, expr: ast.AST, seen: set[str],
             window: ast.AST | None = None) -> bool:
    """``expr`` is a mean-reduced loss, followed along its spine (names to their values).
    A call given ``num_items_in_batch=`` a count of the whole window is no mean of its own
    micro-batch: HF divides the sum by the window's count."""
    if isinstance(expr, ast.Name):
        if expr.id in seen:
            return False
        seen.add(expr.id)
        values = _name_values(ctx, scope)[0].get(expr.id, [])
        return bool(values) and all(_is_mean(ctx, scope, v, seen, window) for v in values)
    if isinstance(expr, ast.Attribute) and expr.attr == "loss":
        out = expr.value
        calls = [out] if isinstance(out, ast.Call) else (
            _name_values(ctx, scope)[0].get(out.id, []) if isinstance(out, ast.Name) else [])
        for call in calls:
            count = num_items_arg(call)
            if count is not None and not (
                    window is not None and counted_per_micro_batch(ctx, scope, window, count)):
                return False
        return isinstance(out, ast.Call | ast.Name)  # a model output's mean loss
    if isinstance(expr, ast.Subscript):
        return _is_mean(ctx, scope, expr.value, seen, window)
    if not isinstance(expr, ast.Call):
        return False
    count = num_items_arg(expr)
    if count is not None:
        return window is not None and counted_per_micro_batch(ctx, scope, window, count)
    name = call_attr(expr) if isinstance(expr.func, ast.Attribute) else (dotted(expr.func) or "")
    if name == "mean" and isinstance(expr.func, ast.Attribute):
        return not expr.args and not expr.keywords  # the mean over everything
    if name in _MEAN_FUNCS:
        return reduction(expr) == "mean"
    return (dotted(expr.func) or "") in mean_criteria(ctx)


def _k_in_sight(ctx: FileContext, window: ast.AST) -> str | None:
    """The name of K that bounds the window: its loop's ``range(K)`` or a modulo by K (in the
    window or in a backward helper it calls per micro-batch), named like one; else the name
    its boundary test reads K from (``if (i + 1) % self.K == 0: ...step()``)."""
    nodes: list[ast.AST] = []
    if isinstance(window, ast.For | ast.AsyncFor):
        nodes.append(window.iter)
    nodes += [n.right for part in (window, *ctx.inlined(window)) for n in walk_all(part)
              if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
    for node in nodes:
        for sub in walk_all(node):
            if isinstance(sub, ast.Name | ast.Attribute) and ctx.mentions_accum(sub):
                return dotted(sub)
    boundary = ctx.window_k_names(window)
    return min(boundary) if len(boundary) == 1 else None


def plain_windows(ctx: FileContext) -> Iterator[ast.AST]:
    """The hand-written windows whose backwards take each micro-batch's loss as it is (plain
    ``loss.backward()``, one guarded optimizer step, no summed loss, no engine or Accelerate
    doing the scaling) in a file where K divides nothing: the windows in which a mean loss
    weighs K x (AG122, AG129)."""
    if _k_scales_something(ctx):
        return
    for window in ctx.windows():
        if _k_scales_something(ctx, frozenset(ctx.window_k_names(window))):
            continue
        facts = ctx.window_facts(window)
        if not (not facts.accumulating or facts.summed_loss or facts.unguarded_optimizer_steps
                or facts.accelerate or facts.engine_backward or ctx.window_k_is_one(window)):
            yield window


def _backwarded(call: ast.Call) -> ast.AST | None:
    """The loss a backward takes as it is: ``loss.backward()``, Lightning's
    ``self.manual_backward(loss)`` and Fabric's ``fabric.backward(loss)`` (neither divides
    by K: manual optimisation and Fabric leave the scale to the script); None for another
    call (DeepSpeed's, Accelerate's: they divide by their own K)."""
    if call.keywords:
        return None
    attr = call_attr(call)
    if attr == "backward" and not call.args:
        return receiver(call)
    if len(call.args) == 1 and (attr == "manual_backward" or (
            attr == "backward" and "fabric" in (dotted(receiver(call)) or "").lower())):
        return call.args[0]
    return None


def divide_factor_with_k(ctx: FileContext) -> bool:
    """FSDP2's ``set_gradient_divide_factor`` is given an expression with K: the engine
    divides the window's sum by it (the division by K the loss does not carry)."""
    return any(isinstance(c, ast.Call) and call_attr(c) == "set_gradient_divide_factor"
               and any(ctx.mentions_accum(resolved_factor(ctx, a)) for a in c.args)
               for c in ctx.of(ast.Call))


@rule("AG122")
def mean_loss_never_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    if divide_factor_with_k(ctx):
        return
    for window in plain_windows(ctx):
        k = _k_in_sight(ctx, window)
        if k is None:
            continue
        backwards = ctx.backward_scopes(window)
        if not backwards:
            continue
        losses: list[tuple[ast.AST, ast.AST]] = []
        for scope, call in backwards:
            loss = _backwarded(call)
            if (isinstance(loss, ast.Call) and call_attr(loss) == "scale" and len(loss.args) == 1
                    and "scaler" in (dotted(receiver(loss)) or "").lower()):
                loss = loss.args[0]  # scaler.scale(loss).backward(): the scale is undone
            if loss is None:
                losses = []
                break
            losses.append((scope, loss))
        if not losses or not all(
            _plain_loss(ctx, scope, x, set(), _local_funcs(ctx), set())
            and _is_mean(ctx, scope, x, set(), window) for scope, x in losses
        ):
            continue
        yield ctx.finding(
            "AG122",
            backwards[0][1],
            f"each micro-batch's mean loss is backwarded as is in a window of `{k}` micro-batches "
            f"and nothing in the file divides by `{k}`: the window's gradient is the sum of K means, "
            "K times the large batch's mean gradient (with SGD, K times the learning rate)",
        )


def _world_scales_something(ctx: FileContext) -> bool:
    """The world size multiplies or divides something in the file (``loss * W``,
    ``count / W``, an LR scaled by W): the rule stays silent. Arithmetic that places a
    rank's data (an offset built with the rank, ``((it * K + m) * world + rank) * bs``; a
    slice or ``range`` bound) scales no loss and is not counted."""
    averaging = set(hand_average(ctx))
    for n in ctx.of(ast.BinOp, ast.AugAssign):
        if n in averaging:
            continue
        if isinstance(n.op, ast.Mult | ast.Div):
            sides = (n.left, n.right) if isinstance(n, ast.BinOp) else (n.target, n.value)
            if any(ctx.mentions_world(s) for s in sides) and not _places_data(ctx, n) \
                    and _about_scale(ctx, n) and not _in_log(ctx, n):
                return True
    return False


def _in_log(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` is only printed or logged (inside an f-string, a ``print``/``log``/``info``
    call's arguments): ``print(f"loss {float(loss_accum) * world:.4f}")`` scales nothing."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.stmt):
        if isinstance(cur, ast.JoinedStr):
            return True
        if isinstance(cur, ast.Call) and (dotted(cur.func) or "").rsplit(".", 1)[-1] in (
                "print", "log", "info", "debug", "warning", "log_dict", "write", "add_scalar"):
            return True
        cur = ctx.parents.get(cur)
    return False


#: identifiers of what a world-size factor could compensate: the loss, a count, the learning
#: rate, the gradients, a scale or weight
_SCALED_RE = re.compile(r"loss|lr$|^lr|learning_rate|^grads?$|^grad_(?!acc)|_grads?$|scale"
                        r"|weight|coef|norm|tok|count|valid|mask|num_items|n_items|denom"
                        r"|factor")


def _about_scale(ctx: FileContext, node: ast.AST) -> bool:
    """The statement around ``node`` touches something a world-size factor could compensate
    (not a data size: ``pack(max_iters * K * world * bs)``), or a value the file all-reduces
    (``n = n / world`` after ``all_reduce(n)``: the count's rank share, whatever its name)."""
    cur: ast.AST | None = node
    while cur is not None and not isinstance(cur, ast.stmt):
        cur = ctx.parents.get(cur)
    if cur is not None and any(isinstance(x, ast.Call) and call_attr(x) in (
            "backward", "manual_backward") for x in ast.walk(cur)):
        return True  # `(err * world / n_all).backward()`: what it scales is the loss
    reduced = ctx.all_reduced_names(ctx.scope_of(node)) | ctx.all_reduced_names(ctx.tree)
    return any(isinstance(x, ast.Name | ast.Attribute) and (_SCALED_RE.search(
        (x.id if isinstance(x, ast.Name) else x.attr).lower()) or dotted(x) in reduced)
        for x in ast.walk(cur if cur is not None else node))


_RANK_RE = re.compile(r"(^|_)rank$|get_rank|rank_id|process_index")


def _places_data(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` computes where a rank's data is: the arithmetic it is part of names the rank,
    or it sits in a subscript's slice or a ``range(...)`` call."""
    cur: ast.AST | None = node
    while cur is not None and not isinstance(cur, ast.stmt):
        parent = ctx.parents.get(cur)
        if isinstance(parent, ast.Subscript) and parent.slice is cur:
            return True
        if isinstance(parent, ast.Slice) or (isinstance(parent, ast.Call)
                                              and call_attr(parent) == "range"):
            return True
        cur = parent
    # the arithmetic around the factor names the rank (``((it * K + m) * world + rank) *
    # bs``); a rank that only indexes the data the loss is computed on (``f(x[s, rank]) *
    # world / n``) places nothing
    top = node
    while isinstance(ctx.parents.get(top), ast.BinOp | ast.UnaryOp):
        top = ctx.parents[top]
    stack = [top]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.Name | ast.Attribute) and _RANK_RE.search(
                (x.id if isinstance(x, ast.Name) else x.attr).lower()):
            return True
        if not isinstance(x, ast.Call | ast.Subscript):
            stack.extend(ast.iter_child_nodes(x))
    return False


def loss_divisions_by_rank_sum(ctx: FileContext, *, accelerate: bool
                               ) -> Iterator[tuple[ast.AST, tuple[ast.AST, ast.AST]]]:
    """Each division of a loss that reaches a backward by a count summed over every rank,
    with its (dividend, divisor)."""
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = division(node)
        if d is not None and is_loss_division(ctx, node, d[0]) and flows_to_backward(ctx, node) \
                and summed_over_ranks(ctx, d[1], accelerate=accelerate):
            yield node, d


def _grads_summed_by_hand(ctx: FileContext) -> bool:
    """The file SUM-all-reduces gradients by hand (``dist.all_reduce(p.grad)``, the default
    op): on top of DDP's average that restores the sum over the ranks (AG108 says what it
    costs)."""
    for c in ctx.of(ast.Call):
        if not isinstance(c, ast.Call) or call_attr(c) != "all_reduce" or not c.args \
                or "grad" not in ast.unparse(c.args[0]):
            continue
        op = c.args[1] if len(c.args) > 1 else next(
            (k.value for k in c.keywords if k.arg == "op"), None)
        if op is None or ast.unparse(op).split(".")[-1].upper() == "SUM":
            return True
    return False


@rule("AG123")
def global_count_then_ddp_average(ctx: FileContext) -> Iterator[Finding]:
    """A loss divided by a count summed over every rank, under DDP/FSDP's own average."""
    prepared = ctx.accelerate and ctx.accelerate_prepare
    by_hand = not ctx.ddp_wrapped and not prepared and bool(hand_average(ctx))
    if not (ctx.ddp_wrapped or prepared or by_hand) or not ctx.is_training_script() \
            or _world_scales_something(ctx) or custom_rank_reduction(ctx):
        return
    if any(ctx.window_facts(w).engine_backward for w in ctx.windows()):
        return
    if ctx.ddp_wrapped and _grads_summed_by_hand(ctx):
        return  # DDP's average times the hand SUM is the sum over ranks: the count's mean
    for node, d in loss_divisions_by_rank_sum(ctx, accelerate=prepared):
        if by_hand:
            avg = hand_average(ctx)[0]
            how = (f"line {getattr(avg, 'lineno', 0)} (`{ast.unparse(avg)}`) then averages the summed gradients "
                   "over the W ranks")
            fix = ("remove that division: the count already spans every rank (or multiply the "
                   "loss by the world size)")
        else:
            accel = prepared and not ctx.ddp_wrapped
            how = ("the model `accelerator.prepare` wrapped (DDP/FSDP/DeepSpeed on W processes)"
                   if accel else "the model's DDP/FSDP wrapper") + \
                " then averages the gradients over the W ranks"
            fix = (f"multiply the loss by {'accelerator.num_processes' if accel else 'the world size'}"
                   ", or divide by the count's rank share (global_count / world_size)")
        yield ctx.finding(
            "AG123",
            node,
            f"the loss is divided by `{ast.unparse(d[1])}`, a count summed over every rank, "
            f"and {how}: the optimizer receives G / W",
            fix=fix,
        )
