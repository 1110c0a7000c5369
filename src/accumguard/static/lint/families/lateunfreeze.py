"""Parameters unfrozen after ``accelerator.prepare`` (F10): AG346.

Accelerate wraps the model in DDP inside ``prepare``; DDP's reducer holds the parameters that
required a gradient then. A PEFT model (``get_peft_model`` freezes every base parameter but
the adapters) or a model frozen by hand before ``prepare``, whose head is unfrozen later
(``requires_grad_(True)`` at epoch N, progressive unfreezing), trains that head on each
rank's own gradient: DDP never averages it and the ranks' copies drift apart.

Reported on the unfreeze, when it runs after ``prepare``: below it in the same function, or
in another method of the class whose ``__init__`` calls ``prepare``; and the file froze
something before (``get_peft_model``, or ``requires_grad_(False)`` / ``requires_grad = False``
before ``prepare``). A warning: on one process there is no DDP and nothing to average (the
launch is not in the file). Silent when ``prepare`` runs again after the unfreeze, or when the
script reduces gradients by hand. The same for a PEFT adapter added after ``prepare``
(``add_adapter``): its parameters did not exist when DDP was built.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.unreduced import reduces_grads_by_hand
from accumguard.static.lint.families.wrapbypass import _freezes

__all__ = ["adapter_added_after_prepare", "unfrozen_after_prepare"]


def _prepares(ctx: FileContext) -> list[ast.Call]:
    return [c for c in ctx.of(ast.Call) if call_attr(c) == "prepare" and c.args
            and ctx.is_accelerator(c.func.value if isinstance(c.func, ast.Attribute) else None)]


def _after(ctx: FileContext, node: ast.AST, prep: ast.Call) -> bool:
    """``node`` runs after ``prep``: below it in the same function, or in another method of
    the class whose ``__init__`` runs ``prep``."""
    fn, pfn = ctx.enclosing(node, FUNCS), ctx.enclosing(prep, FUNCS)
    if fn is pfn:
        return getattr(node, "lineno", 0) > prep.lineno
    cls, pcls = ctx.enclosing(node, (ast.ClassDef,)), ctx.enclosing(prep, (ast.ClassDef,))
    return (cls is not None and cls is pcls and isinstance(pfn, ast.FunctionDef)
            and pfn.name == "__init__" and isinstance(fn, ast.FunctionDef)
            and fn.name != "__init__")


@rule("AG346")
def unfrozen_after_prepare(ctx: FileContext) -> Iterator[Finding]:
    preps = _prepares(ctx)
    if not preps or reduces_grads_by_hand(ctx):
        return  # (gradients reduced by hand: the script may average them itself)
    toggles = [(n, got) for n in ctx.of(ast.Call, ast.Assign) if (got := _freezes(n))]
    peft = any((dotted(c.func) or "").rsplit(".", 1)[-1] == "get_peft_model" for c in ctx.of(ast.Call))
    for node, (target, on) in toggles:
        if not on:
            continue
        prep = next((p for p in preps if _after(ctx, node, p)), None)
        if prep is None or any(_after(ctx, p, node) if isinstance(node, ast.Call) else False
                               for p in preps if p is not prep):
            continue
        froze = peft or any(not o and not _after(ctx, n, prep) for n, (_, o) in toggles)
        if not froze:
            continue
        yield ctx.finding(
            "AG346", node,
            f"`{target}` is unfrozen here, after `{ast.unparse(prep.func)}(...)` (line "
            f"{prep.lineno}) wrapped the model"
            + (" (get_peft_model froze the base model's parameters)" if peft else "")
            + ": on several processes DDP's reducer holds the parameters that required a "
            "gradient when it was built, so this one's gradient is never averaged over the "
            "ranks and each rank steps it on its own")
        return


@rule("AG346")
def adapter_added_after_prepare(ctx: FileContext) -> Iterator[Finding]:
    """AG346 for a PEFT adapter added after ``prepare`` (``model.add_adapter("task", cfg)``,
    then ``set_adapter``): its parameters are made after Accelerate's DDP was built, so no
    reducer holds them. Silent when the model is prepared again after it."""
    preps = _prepares(ctx)
    if not preps or reduces_grads_by_hand(ctx):
        return
    model_preps = [p for p in preps if any("model" in (dotted(a) or "").lower() or
                                           isinstance(a, ast.Name) for a in p.args)]
    for call in ctx.of(ast.Call):
        if call_attr(call) != "add_adapter":
            continue
        prep = next((p for p in preps if _after(ctx, call, p)), None)
        if prep is None:
            continue
        again = [p for p in model_preps if p is not prep and (
            _after(ctx, p, call) or (ctx.enclosing(p, FUNCS) is ctx.enclosing(call, FUNCS)
                                     and p.lineno > call.lineno))]
        if any(len(p.args) > 1 or "model" in ast.unparse(p).lower() for p in again):
            continue  # the model prepared again after the new adapter
        yield ctx.finding(
            "AG346", call,
            f"`{ast.unparse(call.func)}(...)` adds an adapter after `{ast.unparse(prep.func)}"
            f"(...)` (line {prep.lineno}) wrapped the model: on several processes DDP's "
            "reducer holds the parameters that required a gradient when it was built, so "
            "the new adapter's gradient is never averaged over the ranks and each rank steps "
            "it on its own",
            fix="add the adapter before preparing the model, or prepare the model again "
                "after adding it (and build its optimizer after)")
        return
