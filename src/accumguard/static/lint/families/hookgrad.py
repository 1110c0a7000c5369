"""A gradient changed in Hugging Face's ``on_substep_end`` (F3): AG149.

The Trainer calls ``TrainerCallback.on_substep_end`` after every micro-batch of a window
*but the last* (the last one ends in ``on_pre_optimizer_step`` / ``on_step_end``). Code
there that zeroes or masks ``.grad`` (rows zeroed to freeze them, a 0/1 mask, a
``zero_grad``) acts on the partial sums of micro-batches 1 .. K-1 and never on the last
micro-batch's gradient: the masked entries step on the last micro-batch's gradient alone
(F3 for those entries) for any ``gradient_accumulation_steps`` above 1. Reading gradients
there (logging a norm) is fine, and so is a stash the same callback puts back in
``on_pre_optimizer_step`` (the window's whole gradient restored before the step). The change
belongs in
``on_pre_optimizer_step``, which runs once per optimizer step on the window's whole
gradient. Helpers the hook calls are followed (a ``mask_rows_(model)`` of the file).

AG192 (F3): a Lightning hook that runs on every batch (``on_train_batch_start``,
``on_train_batch_end``, ``on_before_backward``, ``on_after_backward``, in a ``Callback`` or
the module) calls ``zero_grad`` with no condition, while the Trainer is given
``accumulate_grad_batches``: it clears the gradient the window has accumulated so far, and
each step receives the last micro-batch (or none) of its window.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_reach import MAX_DEPTH
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import LIGHTNING_PER_BATCH, accumulation_given

_HOOK = "on_substep_end"
#: in-place writes that zero or mask entries (clipping there is a different failure, F8)
_CLEARS = frozenset({"zero_", "fill_", "mul_", "masked_fill_", "index_fill_", "copy_"})


def _on_grad(node: ast.AST | None) -> bool:
    """``p.grad``, ``p.grad.data``, ``p.grad[:n]``, ``p.grad.data[idx]``."""
    while isinstance(node, ast.Subscript) or (isinstance(node, ast.Attribute) and node.attr == "data"):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"


def _writes_grad(node: ast.AST) -> str | None:
    """How ``node`` changes a gradient, in words, or None when it does not."""
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if _on_grad(t):
                return f"`{ast.unparse(t)}` is assigned"
        return None
    if not isinstance(node, ast.Call):
        return None
    attr = call_attr(node) or ""
    if attr == "zero_grad":
        return f"`{ast.unparse(node.func)}()` clears the gradient"
    if attr in _CLEARS and _on_grad(receiver(node)):
        return f"`{ast.unparse(node.func)}` changes the gradient in place"
    return None


def _writes(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int,
            seen: set[ast.AST]) -> Iterator[tuple[ast.AST, str, str]]:
    """The gradient writes of ``fn`` and of the file's functions it calls: (node, how, where)."""
    seen.add(fn)
    for n in ctx.local_nodes(fn):
        how = _writes_grad(n)
        if how is not None:
            yield n, how, fn.name
        elif isinstance(n, ast.Call) and depth < MAX_DEPTH:
            callee = ctx.callee_of(n)
            if callee is not None and callee not in seen:
                yield from _writes(ctx, callee, depth + 1, seen)


def _restored_before_step(ctx: FileContext, hook: ast.AST) -> bool:
    """The hook's class also writes ``.grad`` in ``on_pre_optimizer_step`` (itself or
    through the file's functions it calls): a callback that stashes each micro-batch's
    gradient and puts the window's sum back before the step; what reaches the optimizer is
    decided there, not in ``on_substep_end``."""
    cls = ctx.enclosing(hook, (ast.ClassDef,))
    if not isinstance(cls, ast.ClassDef):
        return False
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) \
                and fn.name == "on_pre_optimizer_step":
            if any(True for _ in _writes(ctx, fn, 0, set())):
                return True
            if any(isinstance(n, ast.Call) and call_attr(n) == "add_" and _on_grad(receiver(n))
                   for f in [fn, *filter(None, (ctx.callee_of(c) for c in ctx.local_nodes(fn)
                                                if isinstance(c, ast.Call)))]
                   for n in ctx.local_nodes(f)):
                return True
    return False


@rule("AG149")
def grad_changed_in_substep_hook(ctx: FileContext) -> Iterator[Finding]:
    hooks = [f for f in ctx.of(*FUNCS) if f.name == _HOOK
             and isinstance(ctx.enclosing(f, (ast.ClassDef,)), ast.ClassDef)]
    if not hooks or ctx.trainer_ga()[0] == 1:
        return  # GA = 1: the Trainer never calls on_substep_end
    for func in hooks:
        if _restored_before_step(ctx, func):
            continue
        for node, how, where in _writes(ctx, func, 0, set()):
            inside = f"`{_HOOK}`" if where == _HOOK else f"`{where}`, which `{_HOOK}` calls"
            yield ctx.finding(
                "AG149",
                node,
                f"{how} in {inside}: the Trainer calls it after every micro-batch of a "
                "window but the last, so it acts on micro-batches 1 .. K-1 and never on the last "
                "one's gradient, which reaches the optimizer unchanged in the entries it clears",
            )




@rule("AG192")
def zero_grad_in_per_batch_lightning_hook(ctx: FileContext) -> Iterator[Finding]:
    if not accumulation_given(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in LIGHTNING_PER_BATCH \
                or ctx.enclosing(fn, (ast.ClassDef,)) is None:
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and call_attr(call) == "zero_grad"):
                continue
            if ctx.enclosing(call, (ast.If, ast.IfExp)) is not None \
                    and ctx.enclosing(ctx.enclosing(call, (ast.If, ast.IfExp)) or call, FUNCS) is fn:
                continue  # (under a condition: between windows, judged elsewhere)
            yield ctx.finding(
                "AG192",
                call,
                f"`{ast.unparse(call)}` runs in `{fn.name}`, which Lightning calls on every "
                "batch, while the Trainer accumulates (accumulate_grad_batches): it clears the "
                "gradient the window has summed so far, so each optimizer step receives only "
                "the gradient of the batches after the last clear",
            )
            return
