"""Accelerate rules: what ``accelerator.backward`` already does to the loss.

AG121 the loss is divided by the number of accumulation steps before
      ``accelerator.backward(loss)`` while the ``Accelerator`` was built with
      ``gradient_accumulation_steps`` = K > 1: ``backward`` divides by K itself (outside
      DeepSpeed, whose engine divides instead), so the loss is divided twice and the
      gradient is G / K.
AG128 the ``Accelerator`` was built with ``gradient_accumulation_steps`` = K > 1 but the
      file never enters ``accelerator.accumulate(model)`` (nor ``no_sync``), and the loop
      running ``accelerator.backward`` steps its optimizer on every batch: without
      ``accumulate()`` Accelerate keeps ``sync_gradients`` True, so the prepared optimizer
      steps (and zero_grads) after every micro-batch, each on 1/K of its gradient.
AG171 (F14) one ``accelerator.accumulate(model)`` block runs a whole window (a loop of
      ``accelerator.backward`` calls) while the ``Accelerator`` was built with
      ``gradient_accumulation_steps`` = K > 1: Accelerate counts one micro-step per block, so
      the prepared optimizer steps on every K-th block only, once every K windows, and
      ``backward`` divides each loss by K again (AG121's "G / K" is then not what happens:
      the step gets the mean of K windows).
AG176 (LOSS_SCALE) a plain ``loss.backward()`` inside ``accelerator.accumulate()`` (in the
      window or a helper it calls) while the ``Accelerator`` accumulates K > 1, the loss not
      divided by K: only ``accelerator.backward`` divides by K, so the window's gradient is
      the sum of K micro-batch losses, K times the large batch's.
AG322 (F1) ``accelerator.accumulate(model)`` around the steps while the ``Accelerator`` was
      built without ``gradient_accumulation_steps`` (Accelerate's default 1) and the file
      declares one K > 1 for accumulation (a config field, a constant, an argparse
      default) that nothing hands the Accelerator: ``accumulate()`` then synchronises on
      every batch and the optimizer steps on every micro-batch. Not when the block runs a
      loop of backwards itself (a whole window per batch: K = 1 is then right).
AG361 (F3) inside ``accelerator.accumulate(model)``, with K > 1, ``zero_grad()`` called on the
      optimizer object given to ``prepare`` instead of the one ``prepare`` returned
      (``model, opt = accelerator.prepare(model, optimizer)`` then ``optimizer.zero_grad()``):
      the prepared optimizer skips its zero_grad on the micro-steps that do not sync, the raw
      one clears the gradients on every micro-batch, so each step gets the last micro-batch's
      gradient only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import (
    assigned_names,
    divides_by_k,
    division,
    is_loss_division,
)
from accumguard.static.lint.families._masked import (
    counted_per_micro_batch,
    counts_window,
)
from accumguard.static.lint.families._modguard import k_values
from accumguard.static.lint.families.twice import k_dividing_helpers, k_helper_result

__all__ = ["accelerate_block_runs_a_window", "accumulate_with_accelerator_k_one", "plain_backward_inside_accumulate", "accelerator_k_without_accumulate", "accelerator_ks", "names_k", "loss_divided_before_accelerator_backward", "raw_optimizer_cleared_inside_accumulate"]


def accelerator_ks(ctx: FileContext) -> set[int | None]:
    """The ``gradient_accumulation_steps`` values given to ``Accelerator(...)`` in the file,
    or the ``num_steps`` of the ``GradientAccumulationPlugin`` it is given (the call, or a
    name bound once to it)."""
    values: set[int | None] = set()
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").split(".")[-1] == "Accelerator":
            for kw in call.keywords:
                if kw.arg == "gradient_accumulation_steps":
                    values |= k_values(ctx, kw.value, call)
                elif kw.arg == "gradient_accumulation_plugin":
                    plugin: ast.AST | None = kw.value
                    if isinstance(plugin, ast.Name):
                        bound = ctx.values_by_name().get(plugin.id, [])
                        plugin = bound[0] if len(bound) == 1 else None
                    steps = next((k.value for k in plugin.keywords if k.arg == "num_steps"), None) \
                        if isinstance(plugin, ast.Call) else None
                    values |= k_values(ctx, steps, call) if steps is not None else {None}
    return values


def names_k(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` reads what the file hands ``Accelerator(gradient_accumulation_steps=...)``
    (``ga``, ``cfg.accum``), a ``GradientAccumulationPlugin(num_steps=...)``, or sets as
    ``accelerator.gradient_accumulation_steps``, or its integer value."""
    def compute() -> set[str]:
        given = {ast.unparse(kw.value) for call in ctx.of(ast.Call)
                 if (dotted(call.func) or "").split(".")[-1] in ("Accelerator", "GradientAccumulationPlugin")
                 for kw in call.keywords if kw.arg in ("gradient_accumulation_steps", "num_steps")
                 and isinstance(kw.value, ast.Name | ast.Attribute | ast.Subscript)}
        # `acc.gradient_accumulation_steps = k` (a K the script sets later: a warm-up of K)
        given |= {ast.unparse(node.value) for node in ctx.of(ast.Assign)
                  if isinstance(node.value, ast.Name | ast.Attribute | ast.Subscript)
                  and any(isinstance(t, ast.Attribute) and t.attr == "gradient_accumulation_steps"
                          and ctx.is_accelerator(t.value) for t in node.targets)}
        return given
    names: set[str] = ctx._cached("accelerator_k_names", ctx.tree, compute)
    ks = accelerator_ks(ctx)
    # (`HP["K"]` as the Accelerator got it, or a config entry holding its value)
    return any((isinstance(x, ast.Name | ast.Attribute | ast.Subscript) and ast.unparse(x) in names)
               or (isinstance(x, ast.Constant) and x.value in ks)
               or (isinstance(x, ast.Subscript) and ctx.int_value(x) in ks) for x in walk_all(expr))


def _accelerator_backwards(ctx: FileContext, scope: ast.AST) -> list[tuple[ast.Call, set[str]]]:
    """``accelerator.backward(loss)`` calls in ``scope`` with the names their loss is made of."""
    return [(call, names) for call, names in ctx.backward_losses(scope)
            if call_attr(call) == "backward" and call.args
            and ctx.is_accelerator(receiver(call))]


def _times_k(ctx: FileContext, dividend: ast.AST) -> bool:
    """The dividend is multiplied by K (``loss * K / min(K, left)``: a short window's own
    size undoing ``backward``'s /K, not a second division)."""
    return any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mult)
               and (ctx.mentions_accum(m.left) or ctx.mentions_accum(m.right))
               for m in walk_all(dividend))


def _k_only_below(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """K divides the divisor (``loss / (n / K)`` multiplies by K, undoing ``backward``'s own
    division), the quotient is multiplied by K (``loss / n * K``), or this division is the
    divisor of another one."""
    parent = ctx.parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.right is node:
        return True
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult) \
            and ctx.mentions_accum(parent.right if parent.left is node else parent.left):
        return True  # ``ce / n_window * K``: the window's count, then backward's /K undone
    inner = division(divisor)
    return inner is not None and ctx.mentions_accum(inner[1]) and not ctx.mentions_accum(inner[0])


def _loss_parts(ctx: FileContext, scope: ast.AST, call: ast.Call) -> set[str]:
    """The names the value of the loss given to ``call`` is made of, where one assignment
    of it in ``scope`` reaches the call (``loss = a * kd + b * ce``: {a, kd, b, ce})."""
    arg = call.args[0] if call.args else None
    if not isinstance(arg, ast.Name):
        return set()
    write = ctx.reaching_write(scope, arg.id, arg)
    if not isinstance(write, ast.Assign):
        return set()
    return {d for n in walk_all(write.value) if isinstance(n, ast.Name | ast.Attribute)
            and (d := dotted(n)) is not None}


def _window_blocks(ctx: FileContext) -> list[tuple[ast.With, ast.AST, ast.Call]]:
    """``with accelerator.accumulate(...):`` blocks whose body runs a loop holding an
    ``accelerator.backward`` call, and steps a prepared optimizer after that loop, inside
    the block: (block, loop, step)."""
    def compute() -> list[tuple[ast.With, ast.AST, ast.Call]]:
        out: list[tuple[ast.With, ast.AST, ast.Call]] = []
        for block in ctx.of(ast.With):
            if not any(isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
                       and ctx.is_accelerator(receiver(i.context_expr)) for i in block.items):
                continue
            loops = [st for st in block.body if isinstance(st, ast.For | ast.While)
                     and any(isinstance(n, ast.Call) and call_attr(n) == "backward"
                             and ctx.is_accelerator(receiver(n)) for n in walk_all(st))]
            if len(loops) != 1:
                continue
            after = block.body[block.body.index(loops[0]) + 1:]
            steps = [n for st in after for n in walk_all(st) if isinstance(n, ast.Call)
                     and call_attr(n) == "step" and ctx.kind_of_receiver(receiver(n)) == "optimizer"
                     and not ctx.unprepared_optimizer(dotted(receiver(n)))]
            if steps:
                out.append((block, loops[0], steps[0]))
        return out
    return ctx._cached("accelerate_window_blocks", ctx.tree, compute)  # type: ignore[no-any-return]


def _in_window_block(ctx: FileContext, node: ast.AST) -> bool:
    return any(node in set(walk_all(loop)) for _, loop, _ in _window_blocks(ctx))


@rule("AG171")
def accelerate_block_runs_a_window(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if not ks or not all(k is not None and k > 1 for k in ks):
        return
    k = max(k for k in ks if k is not None)
    for block, loop, step in _window_blocks(ctx):
        yield ctx.finding(
            "AG171",
            block.items[0].context_expr,
            f"this `accumulate()` block runs a whole window (the loop at line {getattr(loop, 'lineno', '?')} "
            f"calls `accelerator.backward` several times) while the Accelerator accumulates "
            f"too (gradient_accumulation_steps = {k}): Accelerate counts one micro-step per "
            f"block, so `{ast.unparse(step.func)}()` steps only on every {k}th block, once "
            f"every {k} windows, and `accelerator.backward` divides each loss by {k} again",
        )


@rule("AG121")
def loss_divided_before_accelerator_backward(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if ks and all(k is None or k > 1 for k in ks):
        # K out of sight is still > 1 here: the window gathers several micro-batches
        yield from _window_count_findings(ctx)
    if not ks or not all(k is None or k > 1 for k in ks):
        return
    # K out of sight: only a division by the very value handed to the Accelerator is judged
    # (divided twice whenever it is > 1), and only as a warning
    unsure = None in ks
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = division(node)
        if d is None:
            continue
        divisor = d[1]
        if not (ctx.mentions_accum(divisor) or ctx.int_value(divisor) in ks) \
                or (unsure and not names_k(ctx, divisor)):
            continue
        if _k_only_below(ctx, node, divisor) or _times_k(ctx, d[0]):
            continue
        if _in_window_block(ctx, node):
            continue  # AG171: the block runs a window; the step gets the mean of K of them
        scope = ctx.scope_of(node)
        backs = _accelerator_backwards(ctx, scope)
        if not backs:
            continue
        inside = any(node in set(walk_all(call.args[0])) for call, _ in backs)
        names = assigned_names(ctx, node)
        line = getattr(node, "lineno", 0)
        later = any(call.lineno >= line and names & src for call, src in backs)
        whole = is_loss_division(ctx, node, d[0])
        if not (inside or later) and not whole:
            # a term of the loss: a name the backward's loss is assigned from
            later = any(call.lineno >= line and names & _loss_parts(ctx, scope, call) for call, _ in backs)
        if not (inside or later):
            continue
        # (a name that the backward's loss is made of is a term of it: `kd = kd / K`, then
        # `loss = a * kd + b * ce`)
        term = None if whole else next(iter(sorted(names)), None)
        if not whole and (term is None or inside or not later):
            continue
        finding = ctx.finding(
            "AG121",
            node,
            (f"the loss is divided by the accumulation steps (`{ast.unparse(node)}`) before "
             "`accelerator.backward()`, which divides by the Accelerator's "
             "gradient_accumulation_steps itself: the loss is divided twice, and the optimizer "
             "receives G / K") if whole else
            (f"the loss term `{term}` is divided by the accumulation steps "
             f"(`{ast.unparse(node)}`) before it goes into the loss given to "
             "`accelerator.backward()`, which divides the whole loss by the Accelerator's "
             "gradient_accumulation_steps itself: that term is divided twice and weighs 1/K "
             "of its coefficient beside the others")
            + (" (the Accelerator's value is not in sight: right only if it is 1)" if unsure else ""),
        )
        yield replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM) if unsure else finding
    if unsure:
        return  # (a helper's division by a K of its own is judged against a K in sight only)
    # the division in a helper of the file: `loss = compute_loss(batch)` (which returns
    # `loss / grad_accum`), then `accelerator.backward(loss)`
    for call, _ in _accelerator_backwards(ctx, ctx.tree) + [
        b for fn in ctx.of(*FUNCS) for b in _accelerator_backwards(ctx, fn)
    ]:
        helper = k_helper_result(ctx, call.args[0], ctx.scope_of(call))
        if helper is None:
            continue
        _, div = k_dividing_helpers(ctx)[helper]
        yield ctx.finding(
            "AG121",
            call,
            f"`{ast.unparse(call.args[0])}` comes from `{helper}()`, which divides the loss by the "
            f"accumulation steps (`{ast.unparse(div)}`, line {getattr(div, 'lineno', '?')}), and "
            "`accelerator.backward()` divides by the Accelerator's gradient_accumulation_steps "
            "itself: the loss is divided twice, and the optimizer receives G / K",
        )


def _window_count_divisions(ctx: FileContext) -> Iterator[tuple[ast.AST, ast.AST]]:
    """Loss divisions inside an Accelerate window by a count of all the window's
    micro-batches, with nothing in the function multiplying by K to undo ``backward``'s /K."""
    for window in ctx.windows():
        if not ctx.window_facts(window).accelerate:
            continue
        scope = ctx.window_scope(window)
        parts: list[tuple[ast.AST, ast.Call | None]] = [(window, None)]
        parts += list(ctx.inlined(window).items())  # the backward helpers the window calls
        for part, site in parts:
            for sub in ctx.local_nodes(part):
                d = division(sub)
                if d is None or ctx.sized_by_accum(d[1]) \
                        or counted_per_micro_batch(ctx, scope, window, d[1]) \
                        or not is_loss_division(ctx, sub, d[0]):
                    continue
                count = d[1] if site is None else _argument_at(part, site, d[1])
                if count is None or not counts_window(ctx, count):
                    continue
                func = ctx.enclosing(sub, FUNCS) or ctx.tree
                if any(isinstance(m, ast.BinOp | ast.AugAssign) and isinstance(m.op, ast.Mult)
                       and (ctx.mentions_accum(m) or names_k(ctx, m)) for m in ast.walk(func)):
                    continue
                yield sub, d[1]


def _argument_at(helper: ast.AST, site: ast.Call, divisor: ast.AST) -> ast.AST | None:
    """A divisor inside a helper the window calls: itself, or, when it is one of the
    helper's parameters (``n_window``), the argument the window's call passes for it (then
    judged where the window computes it)."""
    if not (isinstance(divisor, ast.Name) and isinstance(helper, ast.FunctionDef | ast.AsyncFunctionDef)):
        return divisor
    params = [a.arg for a in (*helper.args.posonlyargs, *helper.args.args)]
    if divisor.id not in params:
        return divisor
    kw = next((k.value for k in site.keywords if k.arg == divisor.id), None)
    if kw is not None:
        return kw
    i = params.index(divisor.id) - (1 if params and params[0] in ("self", "cls") else 0)
    return site.args[i] if 0 <= i < len(site.args) else None


def _window_count_findings(ctx: FileContext) -> Iterator[Finding]:
    """The loss normalised by the window's count (the Accelerate docs' recipe without its
    ``* gradient_accumulation_steps``): the window's sum is already the large batch's mean."""
    for node, count in _window_count_divisions(ctx):
        yield ctx.finding(
            "AG121",
            node,
            f"the loss is divided by `{ast.unparse(count)}`, a count of all the window's "
            "micro-batches, and `accelerator.backward()` divides it by the Accelerator's "
            "gradient_accumulation_steps as well: the optimizer receives G / K",
            fix="multiply the loss by accelerator.gradient_accumulation_steps (the Accelerate "
                "docs' recipe: loss_sum * K * num_processes / window_count)",
        )


#: Context managers around a micro-step that do not gate accumulation (any other one may be
#: a wrapper of ``accelerator.accumulate`` written elsewhere: then nothing is said).
_NEUTRAL_WITH = {"autocast", "no_grad", "enable_grad", "nullcontext", "record_function",
                 "profile", "set_grad_enabled", "inference_mode", "sdpa_kernel"}


def _enters_accumulation(ctx: FileContext) -> bool:
    """The file enters Accelerate's accumulation (or handles the sync flag) somewhere."""
    for call in ctx.of(ast.Call):
        if call_attr(call) in ("accumulate", "no_sync", "_set_sync_gradients"):
            return True
    for node in ctx.of(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Attribute) and t.attr == "sync_gradients" for t in targets):
            return True
    return False


def _unknown_with(window: ast.AST) -> bool:
    """A ``with`` in the window whose manager is not a known neutral one."""
    for node in ast.walk(window):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                expr = item.context_expr
                name = (dotted(expr.func) if isinstance(expr, ast.Call) else dotted(expr)) or ""
                if name.split(".")[-1] not in _NEUTRAL_WITH:
                    return True
    return False


def _sync_gated(ctx: FileContext, node: ast.AST, window: ast.AST,
                helpers: Mapping[ast.AST, ast.AST]) -> bool:
    """The step is gated by ``if <accelerator>.sync_gradients:`` (in the window, or around the
    call of the helper it is in) and by no other boundary test: without ``accumulate()`` that
    flag stays True, so the gate is always open."""
    seen, cur, child = False, ctx.parents.get(node), node
    followed: set[ast.AST] = set()
    while cur is not None:
        if isinstance(cur, ast.If) and child is not cur.test and ctx.is_boundary_test(cur.test):
            if not (isinstance(cur.test, ast.Attribute) and cur.test.attr == "sync_gradients"):
                return False
            seen = True
        if cur is window:
            return seen
        if isinstance(cur, FUNCS) and cur in helpers and cur not in followed:
            followed.add(cur)
            child, cur = helpers[cur], ctx.parents.get(helpers[cur])
            continue
        child, cur = cur, ctx.parents.get(cur)
    return seen


@rule("AG128")
def accelerator_k_without_accumulate(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if not ks or not all(k is not None and k > 1 for k in ks) or _enters_accumulation(ctx):
        return
    k = next(iter(ks)) if len(ks) == 1 else None
    for window in ctx.windows():
        helpers = {**ctx.reached(window), **ctx.inlined(window)}
        if _unknown_with(window) or not (_accelerator_backwards(ctx, window) or any(
                _accelerator_backwards(ctx, fn) for fn in helpers)):
            continue
        steps = [c for c, kind in ctx.window_facts(window).steps
                 if kind == "optimizer" and (not ctx.guarded(c, window)
                                             or _sync_gated(ctx, c, window, helpers))]
        if not steps:
            continue
        yield ctx.finding(
            "AG128",
            steps[0],
            f"the Accelerator is built with gradient_accumulation_steps = {k or 'K > 1'} but "
            "this loop never enters `accelerator.accumulate(model)`: Accelerate then keeps "
            "`sync_gradients` True, so `accelerator.backward` divides each loss by K and the "
            "prepared optimizer still steps after every batch, on 1/K of that batch's "
            "gradient, instead of once on the window's sum",
        )


@rule("AG176")
def plain_backward_inside_accumulate(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if not ks or 1 in ks or any(k is not None and k < 2 for k in ks):
        return
    unsure = None in ks
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accelerate or facts.summed_loss:
            continue
        parts = [window, *ctx.inlined(window)]
        if any(divides_by_k(ctx, part) for part in parts):
            continue  # the script divides by K itself: judged by AG121 against backward's own
        for part in parts:
            for call in ctx.local_nodes(part):
                if not (isinstance(call, ast.Call) and call_attr(call) == "backward"
                        and isinstance(call.func, ast.Attribute) and not call.args
                        and not ctx.is_accelerator(receiver(call))
                        and ctx.kind_of_receiver(receiver(call)) not in ("engine", "scaler")):
                    continue
                recv = receiver(call)
                if isinstance(recv, ast.Call) and call_attr(recv) == "scale":
                    continue  # a GradScaler's scaled loss: its own division is out of sight
                finding = ctx.finding(
                    "AG176",
                    call,
                    f"`{ast.unparse(call)}` runs inside `accelerator.accumulate()` with the "
                    "Accelerator accumulating K > 1 micro-batches"
                    + (" (its value is not in sight: right only if it is 1)" if unsure else "")
                    + ", but only `accelerator.backward(loss)` divides the loss by K: the "
                    "window's gradient is the sum of K micro-batch losses, K times the large "
                    "batch's",
                )
                yield replace(finding, severity=Severity.WARNING,
                              confidence=Confidence.MEDIUM) if unsure else finding
                return


def _declared_ks(ctx: FileContext) -> dict[int, ast.AST]:
    """Integer K > 1 the file declares for accumulation (a name, attribute or dataclass field
    whose name says accumulation, an argparse option's default), with where."""
    out: dict[int, ast.AST] = {}
    for node in ctx.of(ast.Assign, ast.AnnAssign):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        value = node.value
        if isinstance(value, ast.Constant) and type(value.value) is int and value.value > 1 \
                and isinstance(target, ast.Name | ast.Attribute) and ctx.mentions_accum(target):
            out.setdefault(value.value, node)
    for call in ctx.of(ast.Call):
        if call_attr(call) == "add_argument" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and "accum" in a.value
                for a in call.args):
            d = next((k.value for k in call.keywords if k.arg == "default"), None)
            if isinstance(d, ast.Constant) and type(d.value) is int and d.value > 1:
                out.setdefault(d.value, call)
    return out


def _sets_accelerator_k(ctx: FileContext) -> bool:
    """The file gives the Accelerator a K some other way: a keyword (or ``**kwargs``) at
    construction, a plugin, an attribute assignment, Accelerate's environment variable."""
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").split(".")[-1] == "Accelerator" and any(
                k.arg in (None, "gradient_accumulation_steps", "gradient_accumulation_plugin",
                          "deepspeed_plugin") for k in call.keywords):
            return True
    if any(isinstance(t, ast.Attribute) and t.attr == "gradient_accumulation_steps"
           for n in ctx.of(ast.Assign) for t in n.targets):
        return True
    return any(isinstance(c.value, str) and "GRADIENT_ACCUMULATION_STEPS" in c.value
               for c in ctx.of(ast.Constant))


@rule("AG322")
def accumulate_with_accelerator_k_one(ctx: FileContext) -> Iterator[Finding]:
    ctors = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").split(".")[-1] == "Accelerator"]
    if not ctors or _sets_accelerator_k(ctx):
        return
    ks = _declared_ks(ctx)
    if len(ks) != 1:
        return
    (k, where), = ks.items()
    for block in ctx.of(ast.With, ast.AsyncWith):
        if not any(isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
                   and "accelerator" in ast.unparse(i.context_expr.func).lower()
                   for i in block.items):
            continue
        if any(isinstance(n, ast.For | ast.AsyncFor | ast.While) and any(
                isinstance(b, ast.Call) and call_attr(b) == "backward" for b in walk_all(n))
               for n in walk_all(block)):
            continue  # the block runs a whole window itself (K chunks per batch): K = 1 is right
        scope = ctx.scope_of(block)
        steps = [c for c in ctx.local_nodes(scope) if isinstance(c, ast.Call)
                 and ctx.is_step(c) and not any(
                     isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mod)
                     for g in _guards(ctx, c, scope) for t in walk_all(g))]
        if not steps:
            continue
        yield ctx.finding(
            "AG322", ctors[0],
            f"`{ast.unparse(ctors[0])}` is built without gradient_accumulation_steps (Accelerate "
            f"then uses 1) while the file accumulates K = {k} (line {getattr(where, 'lineno', '?')}) and "
            f"steps inside `accelerator.accumulate(...)` (line {block.lineno}): with K = 1 "
            "accumulate() synchronises and the prepared optimizer steps on every micro-batch, "
            "each step on one micro-batch's gradient")
        return


def _guards(ctx: FileContext, node: ast.AST, scope: ast.AST) -> list[ast.AST]:
    """The tests of the ``if`` statements around ``node`` up to ``scope``."""
    out: list[ast.AST] = []
    cur = ctx.parents.get(node)
    while cur is not None and cur is not scope:
        if isinstance(cur, ast.If):
            out.append(cur.test)
        cur = ctx.parents.get(cur)
    return out


def _raw_behind_prepare(ctx: FileContext) -> dict[str, str]:
    """Plain names given to an ``accelerator.prepare(...)`` whose result is bound to other
    names (the raw object stays under its old name): raw name -> the prepared name at its
    position, for names the file assigns ``torch.optim`` constructors only."""
    out: dict[str, str] = {}
    for node in ctx.of(ast.Assign):
        call = node.value
        if not (isinstance(call, ast.Call) and call_attr(call) == "prepare"
                and ctx.is_accelerator(receiver(call)) and len(node.targets) == 1):
            continue
        tgt = node.targets[0]
        targets = [dotted(t) for t in tgt.elts] if isinstance(tgt, ast.Tuple) else [dotted(tgt)]
        if len(targets) != len(call.args):
            continue
        for arg, new in zip(call.args, targets, strict=True):
            raw = dotted(arg)
            if isinstance(arg, ast.Name) and raw and new and new != raw \
                    and raw not in targets and ctx.kind_of_receiver(arg) == "optimizer":
                out[raw] = new
    return out


@rule("AG361")
def raw_optimizer_cleared_inside_accumulate(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if not ks or not all(k is not None and k > 1 for k in ks):
        return
    raws = _raw_behind_prepare(ctx)
    if not raws:
        return
    for block in ctx.of(ast.With):
        if not any(isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
                   and ctx.is_accelerator(receiver(i.context_expr)) for i in block.items):
            continue
        for n in walk_all(block):
            if not (isinstance(n, ast.Call) and call_attr(n) == "zero_grad"
                    and (raw := dotted(receiver(n))) in raws):
                continue
            if any(isinstance(p, ast.If) and "sync_gradients" in ast.unparse(p.test)
                   for p in _ancestors(ctx, n, block)):
                continue  # cleared only when Accelerate syncs: at the window's end
            yield ctx.finding(
                "AG361",
                n,
                f"`{raw}.zero_grad()` inside `accelerator.accumulate(...)` clears the gradients "
                f"through the optimizer given to `prepare`, not `{raws[raw]}`, the one prepare "
                "returned: the prepared optimizer skips zero_grad on the micro-steps that do not "
                "sync, the raw one runs it on every micro-batch, so each optimizer step gets the "
                "last micro-batch's gradient only",
                fix=f"call `{raws[raw]}.zero_grad()` (the prepared optimizer), as with its step",
            )
            return


def _ancestors(ctx: FileContext, node: ast.AST, stop: ast.AST) -> Iterator[ast.AST]:
    cur = ctx.parents.get(node)
    while cur is not None and cur is not stop:
        yield cur
        cur = ctx.parents.get(cur)
