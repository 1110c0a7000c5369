"""A hand-written schedule's horizon counted in micro-batches (F4): AG333.

nanoGPT-style loops write the learning rate into ``param_groups`` from ``get_lr(iter_num)``,
``iter_num`` counting optimizer steps (``iter_num += 1`` after the window), and a decay
horizon ``lr_decay_iters`` in the same unit. Sized as ``epochs * len(loader)`` over a loader
that the window consumes one micro-batch per micro-step, the horizon is K times the steps
the run makes: the decay gets through 1/K of its way and the rate stays near its peak.
Reported when the schedule's call is given the counter and reads (as an argument, or as a
name its function reads from outside) a horizon whose arithmetic counts a loader's batches
with nothing dividing it; the counter moves once per optimizer step, outside an
accumulating window of K micro-steps inside the same loop; and that window draws the
loader's batches (``next(it)`` of ``iter(loader)``, or iterates it). A counter of
micro-batches is AG130's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import divides, expand, len_args, outside_len
from accumguard.static.lint.families.lrcounter import _lr_sources, _lr_writes, _writes

__all__ = ["hand_schedule_horizon_in_micro_batches"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _batches_only(ctx: FileContext, name: ast.AST) -> str | None:
    """The loader whose batches ``name``'s arithmetic counts, with no division and no K
    anywhere outside ``len()``; else None."""
    parts = expand(ctx, name)
    loaders = len_args(parts)
    if len(loaders) != 1 or divides(parts) or any(
            isinstance(n, ast.Name | ast.Attribute) and ctx.mentions_accum(n)
            for p in parts for n in outside_len(p)):
        return None
    return next(iter(loaders))


def _horizon(ctx: FileContext, call: ast.Call, counter: str) -> tuple[ast.AST, str] | None:
    """(the horizon's name, its loader) among the call's other arguments, or the names the
    called function of the file reads from outside."""
    args = [a for a in [*call.args, *(k.value for k in call.keywords)]
            if isinstance(a, ast.Name) and a.id != counter]
    fn = ctx.callee_of(call)
    if isinstance(fn, FUNCS):
        params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
        args += [n for n in walk_all(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                 and n.id not in params]
    for a in args:
        loader = _batches_only(ctx, a)
        if loader is not None:
            return a, loader
    return None


def _windows_by_loop(ctx: FileContext) -> dict[ast.AST, list[ast.AST]]:
    """The accumulating windows without an unguarded optimizer step, by the loop around
    them that also steps an optimizer itself (one pass, cached)."""
    def compute() -> dict[ast.AST, list[ast.AST]]:
        out: dict[ast.AST, list[ast.AST]] = {}
        steps = {ctx.enclosing(n, _LOOPS) for n in ctx.of(ast.Call) if ctx.is_step(n)}
        for w in ctx.windows():
            outer = ctx.enclosing(w, _LOOPS)
            facts = ctx.window_facts(w)
            if outer is not None and outer in steps and facts.accumulating \
                    and not facts.unguarded_optimizer_steps:
                out.setdefault(outer, []).append(w)
        return out
    return ctx._cached("handhorizon_windows", ctx.tree, compute)  # type: ignore[no-any-return]


def _per_step(ctx: FileContext, scope: ast.AST, counter: str) -> ast.AST | None:
    """The accumulating window inside the loop where ``counter += 1`` runs once per optimizer
    step (after that window, outside it); None otherwise."""
    incs = [n for n in _writes(ctx, scope).get(counter, ([], []))[0]
            if isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant) and n.value.value == 1]
    if len(incs) != 1 or (outer := ctx.enclosing(incs[0], _LOOPS)) is None:
        return None
    found = _windows_by_loop(ctx).get(outer, [])
    return found[0] if found else None


def _iter_names(ctx: FileContext) -> dict[str, set[str]]:
    """Per loader, the names bound to ``iter(loader)`` (one pass, cached)."""
    def compute() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for targets, v in ctx.assignments():
            if isinstance(v, ast.Call) and dotted(v.func) == "iter" and v.args \
                    and (loader := dotted(v.args[0])) is not None:
                out.setdefault(loader, set()).update(targets)
        return out
    return ctx._cached("handhorizon_iters", ctx.tree, compute)  # type: ignore[no-any-return]


def _draws(ctx: FileContext, window: ast.AST, loader: str) -> bool:
    """The window takes the loader's batches: it iterates it, or calls ``next()`` on a name
    bound to ``iter(loader)``."""
    if isinstance(window, ast.For | ast.AsyncFor) and dotted(window.iter) == loader:
        return True
    names = _iter_names(ctx).get(loader, set())
    return bool(names) and any(isinstance(n, ast.Call) and dotted(n.func) == "next" and n.args
                               and dotted(n.args[0]) in names for n in walk_all(window))


@rule("AG333")
def hand_schedule_horizon_in_micro_batches(ctx: FileContext) -> Iterator[Finding]:
    for write in _lr_writes(ctx):
        for scope, values, at in _lr_sources(ctx, write):
            for value in values:
                for call in (n for n in walk_all(value) if isinstance(n, ast.Call)):
                    for counter in (a.id for a in call.args if isinstance(a, ast.Name)):
                        window = _per_step(ctx, scope, counter)
                        found = _horizon(ctx, call, counter) if window is not None else None
                        if window is None or found is None or not _draws(ctx, window, found[1]):
                            continue
                        name, loader = found
                        yield ctx.finding(
                            "AG333",
                            at,
                            f"the schedule `{ast.unparse(call)}` is given `{counter}`, which "
                            f"counts optimizer steps (it moves once after each window of K "
                            f"micro-steps at line {getattr(window, 'lineno', '?')}), but its "
                            f"horizon `{ast.unparse(name)}` counts the batches of `{loader}`, "
                            "one per micro-step: the schedule is K times longer than training "
                            "and never reaches its end",
                        )
                        return
