"""AG133 (LOSS_SCALE): the loss divided by K in a function of the file and divided by K again
where that function's result is used, before the backward.

A helper (a module function or a method) returns ``loss / K``; its caller divides the result
by K once more (``loss = compute_loss(...); (loss / K).backward()``): each micro-batch's
gradient is scaled 1/K², so the window's gradient is G / K. With SGD every update is K times
too small; with Adam the difference hides in epsilon and clipping, but it is not the
large-batch update. The Accelerate form (the helper divides, ``accelerator.backward`` divides
by its own K again) is AG121 (:mod:`.accelerate`), which follows the same helpers.

Judged only when everything is in sight: one definition of the helper's name in the file;
every ``return`` of it a division by K (``return loss / K``, or a name whose only value is
one: ``loss = crit(...) / K`` or an unconditional ``loss /= K``); K named as the accumulation
steps (``grad_accum_steps``, ``self.accumulation_steps``, ``args.gradient_accumulation_steps``,
or an alias of one), not a size or a count (``micro_batch_size``, ``n_tokens``); the caller's
second division by such a K of the helper's result (directly, or through the one name that
holds it) reaching a ``.backward()`` of the same function. A helper dividing by anything else
(a token count, the world size) is not judged.

AG162 (LOSS_SCALE): the opposite DeepSpeed form. ``engine.backward(loss, scale_wrt_gas=False)``
in the documented engine loop, the config's GA > 1 in sight, on a loss that is a micro-batch
mean and nothing else (a mean loss call, directly or through the one name holding it): the
engine's ÷GA is off and nothing else divides, so it sums GA full means (G x GA).

AG164 (LOSS_SCALE): a plain loop's ``(a + alpha * b_sum / n_window) / K``: one term of the sum
is already divided by a count of the whole window's micro-batches (``counts_window``), so the
/K leaves it 1/K of its coefficient. Engines and ``accelerator.backward`` are AG134/AG121's.

AG134 (LOSS_SCALE): the DeepSpeed form. The documented engine loop (``engine.step()`` after
every ``engine.backward()``, no hand gating) is handed a loss already divided by K (inline,
through the name that holds it, or by such a helper) while the config in sight has
``gradient_accumulation_steps`` > 1: ``engine.backward(loss)`` divides by GA itself
(``scale_wrt_gas=True``, DeepSpeed 0.19.8), so the gradient is G / K.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Finding, Severity
from accumguard.static.lint._ast import (
    ACCUM_RE,
    FUNCS,
    call_attr,
    dotted,
    last_part,
    receiver,
    walk_local,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._dswincount import helper_window_division
from accumguard.static.lint.families._lossexpr import (
    MEAN_LOSS_FUNCS,
    division,
    flows_to_backward,
    mean_criteria,
    reduction,
)
from accumguard.static.lint.families._masked import counts_window, counts_window_slice
from accumguard.static.lint.families.deepspeed import _config_ga, _hand_gated_steps

__all__ = [
    "is_k", "k_dividing_helpers", "k_helper_result", "loss_divided_before_engine_backward",
    "loss_divided_by_k_twice", "undivided_loss_without_gas_scaling", "value_before",
    "window_count_term_divided_by_k",
]

#: K-like names that are sizes or counts, not the number of micro-steps
_NOT_K = re.compile(r"bs$|_bs|size|tok|count|len|items|sample|numel|denom|norm")
_CASTS = ("int", "float")
#: DeepSpeed's short names for the accumulation steps (``gas``, ``ga_steps``, ``n_gas``)
_GAS = re.compile(r"^(n_?|num_?)?gas?(_steps?)?$")


def is_k(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` names the number of accumulation steps: its last identifier looks like K
    (and not like a size or count), or it is a name whose one assignment in the file is an
    alias of such a name (``K = args.grad_accum_steps``)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in _CASTS \
            and len(expr.args) == 1:
        expr = expr.args[0]
    d = dotted(expr)
    if d is None or not isinstance(expr, ast.Name | ast.Attribute):
        return False
    last = last_part(d)
    if ACCUM_RE.search(last) or _GAS.match(last):
        return not _NOT_K.search(last)
    if isinstance(expr, ast.Name):
        values = _single_name_values(ctx).get(d, [])
        return len(values) == 1 and isinstance(values[0], ast.Name | ast.Attribute) and is_k(ctx, values[0])
    return False


def _single_name_values(ctx: FileContext) -> dict[str, list[ast.AST]]:
    """The values of every ``name = value`` with one target, by name, once per file."""
    def compute() -> dict[str, list[ast.AST]]:
        out: dict[str, list[ast.AST]] = {}
        for names, value in ctx.assignments():
            if len(names) == 1:
                out.setdefault(names[0], []).append(value)
        return out
    return ctx._cached("single_name_values", ctx.tree, compute)  # type: ignore[no-any-return]


def _k_division(ctx: FileContext, expr: ast.AST | None) -> bool:
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and is_k(ctx, expr.right)


def _returns_k_division(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST | None:
    """The division by K every ``return`` of ``fn`` hands back (the first one), else None."""
    returns = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Return)]
    if not returns:
        return None
    found: list[ast.AST] = []
    for ret in returns:
        value = ret.value
        if _k_division(ctx, value):
            assert value is not None
            found.append(value)
            continue
        if not isinstance(value, ast.Name):
            return None
        writes = [n for n in ctx.local_nodes(fn)
                  if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
                  and any(isinstance(t, ast.Name) and t.id == value.id
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
        divs = [w for w in writes if isinstance(w, ast.AugAssign) and isinstance(w.op, ast.Div)]
        if len(divs) == 1 and divs[0] in fn.body and is_k(ctx, divs[0].value):
            found.append(divs[0])  # `loss /= K` on the function's own level: always applied
        elif len(writes) == 1 and isinstance(writes[0], ast.Assign) and _k_division(ctx, writes[0].value):
            found.append(writes[0].value)
        else:
            return None
    return found[0]


def k_dividing_helpers(ctx: FileContext) -> dict[str, tuple[ast.AST, ast.AST]]:
    """Functions/methods of the file (one definition of the name) whose every return is a
    division by K: name -> (definition, division)."""
    def compute() -> dict[str, tuple[ast.AST, ast.AST]]:
        defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for fn in ctx.of(*FUNCS):
            defs.setdefault(fn.name, []).append(fn)
        out: dict[str, tuple[ast.AST, ast.AST]] = {}
        for name, fns in defs.items():
            if len(fns) == 1 and (div := _returns_k_division(ctx, fns[0])) is not None:
                out[name] = (fns[0], div)
        return out
    return ctx._cached("k_dividing_helpers", ctx.tree, compute)  # type: ignore[no-any-return]


def k_helper_result(ctx: FileContext, expr: ast.AST, scope: ast.AST) -> str | None:
    """The helper's name when ``expr`` is a call of a K-dividing helper (``f(...)``,
    ``self.f(...)``), or a name whose last value before ``expr`` in the same block is one."""
    helpers = k_dividing_helpers(ctx)
    if isinstance(expr, ast.Call):
        d = dotted(expr.func) or ""
        name = d.rsplit(".", 1)[-1]
        if name not in helpers:
            return None
        method = isinstance(ctx.parents.get(helpers[name][0]), ast.ClassDef)
        # a module function called by its name; a method on `self`/`cls` or an object
        # (`runner.compute_loss(b)`): not a same-named function of another module
        if (not method and d == name) or (method and d.count(".") == 1):
            return name
        return None
    if not isinstance(expr, ast.Name):
        return None
    value = value_before(ctx, expr)
    return None if value is None else k_helper_result(ctx, value, scope)


def _earlier_in_block(ctx: FileContext, node: ast.AST) -> list[ast.stmt]:
    """The statements before ``node``'s statement in its block, nearest first (none when
    the statement is in no block of statements)."""
    stmt = ctx.parents.get(node)
    while stmt is not None and not isinstance(stmt, ast.stmt):
        stmt = ctx.parents.get(stmt)
    block = ctx.parents.get(stmt) if stmt is not None else None
    body = next((getattr(block, f) for f in ("body", "orelse", "finalbody")
                 if isinstance(getattr(block, f, None), list) and stmt in getattr(block, f)), None)
    return [] if body is None else list(reversed(body[: body.index(stmt)]))


def value_before(ctx: FileContext, name: ast.Name) -> ast.AST | None:
    """The value of the last ``name = value`` before ``name``'s statement in the same block
    (None when that statement writes the name otherwise, or no such statement precedes it)."""
    for prior in _earlier_in_block(ctx, name):
        if any(isinstance(n, ast.Name) and n.id == name.id and isinstance(n.ctx, ast.Store)
               for n in walk_local(prior)):
            if isinstance(prior, ast.Assign) and len(prior.targets) == 1 \
                    and isinstance(prior.targets[0], ast.Name) and prior.targets[0].id == name.id:
                return prior.value
            return None
    return None


@rule("AG133")
def loss_divided_by_k_twice(ctx: FileContext) -> Iterator[Finding]:
    if not k_dividing_helpers(ctx):
        return
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = division(node)
        if d is None or not is_k(ctx, d[1]):
            continue
        scope = ctx.scope_of(node)
        helper = k_helper_result(ctx, d[0], scope)
        if helper is None or not flows_to_backward(ctx, node):
            continue
        fn, div = k_dividing_helpers(ctx)[helper]
        if fn is scope or any(node is n for n in ctx.local_nodes(fn)):
            continue
        yield ctx.finding(
            "AG133",
            node,
            f"`{ast.unparse(node)}` divides by the accumulation steps a loss that `{helper}()` "
            f"already divided by them (`{ast.unparse(div)}`, line {getattr(div, 'lineno', '?')}): "
            "each micro-batch's gradient is scaled 1/K² and the optimizer receives G / K",
        )


def _divided_by_k(ctx: FileContext, expr: ast.AST) -> tuple[ast.AST, str] | None:
    """(divisor, how) when ``expr`` is a division (its divisor is compared with K and GA by the
    rule): ``loss / d`` itself, the value of
    the name that holds it (its last assignment in the same block), or the result of a
    function of the file whose every return divides by K (:mod:`.twice`)."""
    if isinstance(expr, ast.Name):
        value = value_before(ctx, expr)
        if value is None:
            return None
        expr = value
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return expr.right, f"`{ast.unparse(expr)}`"  # K or not: the caller compares with GA
    helper = k_helper_result(ctx, expr, ctx.scope_of(expr))
    if helper is None:
        return None
    _, div = k_dividing_helpers(ctx)[helper]
    divisor = div.right if isinstance(div, ast.BinOp) else getattr(div, "value", div)
    return divisor, f"`{helper}()` returns `{ast.unparse(div)}` (line {getattr(div, 'lineno', '?')})"


def _engine_loop_backwards(ctx: FileContext, *, no_gas: bool = False) -> Iterator[ast.Call]:
    """``engine.backward(loss)`` calls (one argument, DeepSpeed's default division by GA; with
    ``no_gas``, those given ``scale_wrt_gas=False`` instead) in the documented engine loop:
    ``engine.step()`` after every backward, no hand gating (a hand-gated step is AG109's /
    AG110's)."""
    if ctx.explicit_ds_boundary:
        return
    gated = {id(site) for _, site in _hand_gated_steps(ctx)}
    seen: set[int] = set()
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        steps = [c for c, k in facts.steps if k == "engine"]
        if not facts.engine_backward or not steps or any(id(c) in gated for c in steps):
            continue
        helpers = list(ctx.inlined(window))  # (a backward helper: `train_step(engine, x, y)`)
        for call in [n for scope in (window, *helpers) for n in ctx.local_nodes(scope)]:
            if id(call) in seen:
                continue
            seen.add(id(call))
            if not (isinstance(call, ast.Call) and call_attr(call) == "backward"
                    and ctx.kind_of_receiver(receiver(call)) == "engine" and len(call.args) == 1):
                continue
            off = any(k.arg == "scale_wrt_gas" and isinstance(k.value, ast.Constant)
                      and k.value.value is False for k in call.keywords)
            if off if no_gas else not call.keywords:
                yield call


def _engines_own_ga(ctx: FileContext, divisor: ast.AST, engine: str) -> bool:
    """``divisor`` is ``engine.gradient_accumulation_steps()``, inline or through the name the
    function assigns it to just before."""
    if isinstance(divisor, ast.Name):
        write = ctx.reaching_write(ctx.scope_of(divisor), divisor.id, divisor)
        divisor = write.value if isinstance(write, ast.Assign) and len(write.targets) == 1 else divisor
    return (isinstance(divisor, ast.Call) and not divisor.args and call_attr(divisor) == "gradient_accumulation_steps"
            and dotted(receiver(divisor)) == engine)


@rule("AG134")
def loss_divided_before_engine_backward(ctx: FileContext) -> Iterator[Finding]:
    """The documented engine loop (``engine.step()`` after every ``engine.backward()``) handed a
    loss already divided by K while the config's GA > 1: DeepSpeed divides by GA again."""
    ref = ctx.ds_config()
    for call in _engine_loop_backwards(ctx):
        hit = _divided_by_k(ctx, call.args[0])
        if hit is None or ctx.int_value(hit[0]) == 1:
            continue
        name = dotted(receiver(call)) or "engine"
        if _engines_own_ga(ctx, hit[0], name):
            many = ref is not None and _config_ga(ctx, ref, set())[0] == "many"
            finding = ctx.finding(
                "AG134",
                call,
                f"the loss given to `{name}.backward()` is already divided by the engine's own "
                f"`{name}.gradient_accumulation_steps()` ({hit[1]}), and the engine's backward "
                "divides it by that GA again (scale_wrt_gas=True by default) while it steps "
                "once per GA backward() calls: whenever GA > 1 the loss is divided twice and "
                "the optimizer receives G / GA",
            )
            yield finding if many else replace(finding, severity=Severity.WARNING)
            continue
        if ref is None:
            continue
        verdict, how = _config_ga(ctx, ref, {d for d in (dotted(hit[0]),) if d})
        if verdict != "many" or not (is_k(ctx, hit[0]) or "the loop's own K" in how):
            continue
        yield ctx.finding(
            "AG134",
            call,
            f"the loss given to `{name}.backward()` is already divided by the accumulation steps "
            f"({hit[1]}), and DeepSpeed's backward divides it again by the config's "
            f"gradient_accumulation_steps {how} ({ref.where}; scale_wrt_gas=True by default), "
            "while the engine steps once per GA backward() calls: the loss is divided twice "
            "and the optimizer receives G / K",
        )


@rule("AG134")
def window_count_before_engine_backward(ctx: FileContext) -> Iterator[Finding]:
    """The documented engine loop handed a loss (or one term of it) divided by the window's
    count, a count over all its micro-batches, with nothing multiplying by K, while the
    config's GA > 1: DeepSpeed divides by GA as well, so that term weighs 1/K."""
    ref = ctx.ds_config()
    if ref is None:
        return
    for call in _engine_loop_backwards(ctx):
        via = helper_window_division(ctx, call)
        if via is not None:
            verdict, how = _config_ga(ctx, ref, set())
            if verdict != "one":
                window, count, fn = via
                name = dotted(receiver(call)) or "engine"
                yield ctx.finding(
                    "AG134",
                    call,
                    f"the loss divides a sum by `{count}`, counted over all the micro-batches of "
                    f"`{window}` before they run"
                    + (f" (in `{fn.name}`)" if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) else "")
                    + f", and `{name}.backward()` divides it again by the config's "
                    f"gradient_accumulation_steps {how or '(K, out of sight here)'} ({ref.where}; "
                    "scale_wrt_gas=True by default): each update is 1/K of the large batch's",
                    fix="multiply the window-normalised loss by the gradient accumulation steps "
                        "(sum * K * W / window_count), or call engine.backward(loss, "
                        "scale_wrt_gas=False)",
                )
                continue
        loss: ast.AST | None = call.args[0]
        if isinstance(loss, ast.Name):
            loss = value_before(ctx, loss)
        if loss is None:
            continue
        for term in _sum_terms(ctx, loss):
            d = _window_count_division(ctx, term)
            if d is None:
                continue
            verdict, how = _config_ga(ctx, ref, set())
            if verdict == "one":
                break  # (out of sight it is K: the loop gathers the window's micro-batches)
            how = how or "(K, out of sight here)"
            name = dotted(receiver(call)) or "engine"
            yield ctx.finding(
                "AG134",
                d,
                f"`{ast.unparse(d)}` divides the loss by a count of all the window's "
                f"micro-batches, and `{name}.backward()` divides it again by the config's "
                f"gradient_accumulation_steps {how} ({ref.where}; scale_wrt_gas=True by "
                "default): that term weighs 1/K of the large batch's mean",
                fix="multiply that term by the gradient accumulation steps (sum * K * W / "
                    "window_count), or normalise by the micro-step's share of the count",
            )
            break


def _window_count_division(ctx: FileContext, term: ast.AST) -> ast.AST | None:
    """The division of a term (a product of factors) by a count of the whole window, with
    no factor naming K."""
    stack, found = [term], None
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            if any(is_k(ctx, x) or ctx.mentions_accum(x) or ctx.sized_by_accum(x)
                   for x in (e.left, e.right)):
                return None  # (`* engine_divisor` with `engine_divisor = gas * world`)
            stack += [e.left, e.right]
        elif isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div):
            if is_k(ctx, e.right) or ctx.sized_by_accum(e.right):
                return None
            if counts_window(ctx, e.right) or counts_window_slice(ctx, e.right):
                found = e
            stack.append(e.left)
    return found


def _returned_element(ctx: FileContext, name: ast.Name) -> tuple[ast.AST, ast.AST] | None:
    """``loss`` of ``loss, ce, kd = total_loss(...)`` (a function of the file): the matching
    element of that function's returned tuple, and the function (one definition, every
    return a tuple of the same length)."""
    for prior in _earlier_in_block(ctx, name):
        if not (isinstance(prior, ast.Assign) and len(prior.targets) == 1):
            continue
        target = prior.targets[0]
        if not isinstance(target, ast.Tuple):
            if isinstance(target, ast.Name) and target.id == name.id:
                return None
            continue
        ids = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
        if name.id not in ids or not isinstance(prior.value, ast.Call):
            continue
        fns = ctx.functions_by_name().get(call_attr(prior.value) or "", [])
        if len(fns) != 1:
            return None
        rets = [r.value for r in ast.walk(fns[0]) if isinstance(r, ast.Return)]
        i = ids.index(name.id)
        if not rets or not all(isinstance(r, ast.Tuple) and len(r.elts) == len(ids) for r in rets):
            return None
        return rets[0].elts[i], fns[0]  # type: ignore[union-attr]
    return None


def _sum_terms(ctx: FileContext, expr: ast.AST) -> list[ast.AST]:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _sum_terms(ctx, expr.left) + _sum_terms(ctx, expr.right)
    return [expr]


def _term_k_division(ctx: FileContext, term: ast.AST) -> str | None:
    """How a term (a product of factors) is divided by K: a factor that is a division by
    K, a K-dividing helper's result, or a name holding one."""
    stack = [term]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            stack += [e.left, e.right]
            continue
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div) and is_k(ctx, e.right):
            return f"`{ast.unparse(e)}`"
        helper = k_helper_result(ctx, e, ctx.scope_of(e))
        if helper is not None:
            _, div = k_dividing_helpers(ctx)[helper]
            return f"`{helper}()` returns `{ast.unparse(div)}` (line {getattr(div, 'lineno', '?')})"
    return None


@rule("AG134")
def term_divided_before_engine_backward(ctx: FileContext) -> Iterator[Finding]:
    """One term of the loss handed to the documented engine loop is divided by K while the
    others are not (``loss = ce + w * kd`` with ``kd`` returned as ``kl / K``): DeepSpeed
    divides the whole loss by GA, so that term is divided twice and weighs 1/K of its
    coefficient beside the others."""
    ref = ctx.ds_config()
    if ref is None:
        return
    for call in _engine_loop_backwards(ctx):
        if not isinstance(call.args[0], ast.Name):
            continue
        loss: ast.AST | None = value_before(ctx, call.args[0])
        if loss is None:
            found = _returned_element(ctx, call.args[0])
            loss = found[0] if found is not None else None
        if loss is None:
            continue
        terms = _sum_terms(ctx, loss)
        how = [_term_k_division(ctx, t) for t in terms]
        if len(terms) < 2 or all(h is None for h in how) or all(h is not None for h in how):
            continue
        verdict, ga = _config_ga(ctx, ref, set())
        if verdict != "many":
            continue
        t, h = next((t, h) for t, h in zip(terms, how, strict=True) if h is not None)
        name = dotted(receiver(call)) or "engine"
        yield ctx.finding(
            "AG134",
            call,
            f"the loss given to `{name}.backward()` is a sum whose term `{ast.unparse(t)}` is "
            f"already divided by the accumulation steps ({h}) while the other terms are not; "
            f"DeepSpeed's backward divides the whole loss by the config's "
            f"gradient_accumulation_steps {ga} ({ref.where}) again, so that term is divided "
            "twice: it weighs 1/K of its coefficient beside the others",
        )


def _micro_batch_mean(ctx: FileContext, expr: ast.AST) -> ast.Call | None:
    """``expr`` is a loss call reducing by the mean of this micro-batch and nothing else
    (``F.mse_loss(out, y)``, ``self.criterion(out, y)`` of a mean loss module), directly or
    as the one value of the name that holds it in its function: no division, no factor."""
    if isinstance(expr, ast.Name):
        fn = ctx.enclosing(expr, FUNCS) or ctx.tree
        values = ctx.assigned_in(fn).get(expr.id, [])
        if len(values) != 1 or any(isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
                                   and n.target.id == expr.id for n in ctx.local_nodes(fn)):
            return None
        expr = values[0]
    if not isinstance(expr, ast.Call):
        return None
    name = call_attr(expr) or ""
    if name in MEAN_LOSS_FUNCS and reduction(expr) == "mean":
        return expr
    return expr if (dotted(expr.func) or "") in mean_criteria(ctx) else None


@rule("AG162")
def undivided_loss_without_gas_scaling(ctx: FileContext) -> Iterator[Finding]:
    """The engine's own ÷GA switched off (``scale_wrt_gas=False``) on a micro-batch mean that
    nothing divides, with the config's GA > 1 in sight: the engine sums GA full means."""
    if not any(k.arg == "scale_wrt_gas" for c in ctx.of(ast.Call) for k in c.keywords):
        return
    ref = ctx.ds_config()
    if ref is None:
        return
    verdict, how = _config_ga(ctx, ref, set())
    if verdict != "many":
        return
    for call in _engine_loop_backwards(ctx, no_gas=True):
        loss = _micro_batch_mean(ctx, call.args[0])
        if loss is None:
            continue
        name = dotted(receiver(call)) or "engine"
        yield ctx.finding(
            "AG162",
            call,
            f"`{name}.backward(..., scale_wrt_gas=False)` turns off the engine's division by the "
            f"config's gradient_accumulation_steps {how} ({ref.where}), and the loss it is "
            f"given, `{ast.unparse(loss)}` (line {loss.lineno}), is this micro-batch's mean, "
            "divided by nothing: the engine sums GA such means into one step, GA times the "
            "large batch's gradient",
        )


def _sums_window_batches(ctx: FileContext, divisor: ast.AST, window: ast.AST) -> bool:
    """``n = sum(<...>.sum() for mb in micro)`` with ``for mb in micro:`` the window loop: a
    sum over exactly the window's micro-batches (directly, or the value of the name that
    reaches the division)."""
    if not isinstance(window, ast.For):
        return False
    if isinstance(divisor, ast.Name):
        write = ctx.reaching_write(ctx.scope_of(divisor), divisor.id, divisor)
        if not (isinstance(write, ast.Assign) and len(write.targets) == 1):
            return False
        divisor = write.value
    if not (isinstance(divisor, ast.Call) and (call_attr(divisor) or dotted(divisor.func)) == "sum"
            and len(divisor.args) == 1
            and isinstance(divisor.args[0], ast.GeneratorExp | ast.ListComp)):
        return False
    gen = divisor.args[0]
    return len(gen.generators) == 1 and dotted(gen.generators[0].iter) is not None \
        and dotted(gen.generators[0].iter) == dotted(window.iter) and any(
            isinstance(c, ast.Call) and call_attr(c) in ("sum", "len", "numel", "count_nonzero")
            for c in ast.walk(gen.elt))


def _window_normalised_term(ctx: FileContext, term: ast.AST, window: ast.AST) -> ast.AST | None:
    """The division by a count of the whole window inside ``term`` (a product of factors),
    looked up through the one name a factor holds (``nll = nll_sum / n_window`` then
    ``alpha * nll``), or None."""
    stack = [term]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            stack += [e.left, e.right]
            continue
        if isinstance(e, ast.Name):
            value = value_before(ctx, e)
            if value is None:
                continue
            e = value
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div) \
                and not (is_k(ctx, e.right) or ctx.sized_by_accum(e.right)) \
                and (counts_window(ctx, e.right) or counts_window_slice(ctx, e.right)
                     or _sums_window_batches(ctx, e.right, window)):
            return e
    return None


@rule("AG164")
def window_count_term_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    """``loss = (dpo + alpha * nll_sum / n_window) / K`` then ``loss.backward()``: the term
    already divided by the window's count (a count over all its micro-batches) is divided
    by K as well, so it weighs 1/K of its coefficient."""
    for node in ctx.of(ast.BinOp):
        if not (isinstance(node.op, ast.Div) and is_k(ctx, node.right)):
            continue
        if not flows_to_backward(ctx, node):
            continue
        window = ctx.enclosing(node, (ast.For, ast.AsyncFor, ast.While))
        if window is None or not ctx.is_window(window):
            continue
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.engine_backward or facts.accelerate:
            continue  # (engines and accelerator.backward divide again: AG134, AG121)
        terms = _sum_terms(ctx, node.left)
        if len(terms) < 2:
            continue  # the whole loss over the window's count, then /K: AG104/AG122's
        hit = next((d for t in terms if (d := _window_normalised_term(ctx, t, window)) is not None),
                   None)
        if hit is None:
            continue
        yield ctx.finding(
            "AG164",
            node,
            f"`{ast.unparse(node)}` divides by K a sum of terms one of which, "
            f"`{ast.unparse(hit)}` (line {getattr(hit, 'lineno', '?')}), is already divided by a "
            "count of the "
            "whole window's micro-batches: that term's tokens weigh 1 over the window before "
            "the /K, and 1/K of its coefficient after it",
        )
