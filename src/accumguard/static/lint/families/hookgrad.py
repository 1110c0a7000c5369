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
each step receives the last micro-batch (or none) of its window. The validation hooks count
too when the Trainer validates every N training batches (``val_check_interval=N``) with N not
a multiple of K: validation then lands inside a window.

AG371 (F7): a ``TrainerCallback`` hook runs a backward of its own (a probe batch) and clears
nothing after it: the Trainer clears only after each optimizer step, so that gradient joins
a window's sum.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver
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




_VALIDATION_HOOKS = ("validation_step", "on_validation_start", "on_validation_epoch_start", "on_validation_end",
                     "on_validation_epoch_end", "on_validation_batch_start",
                     "on_validation_batch_end", "on_validation_model_eval")


def _returns_off_boundary(fn: ast.FunctionDef, call: ast.AST) -> bool:
    """An ``if <a test on the window's position>: return`` precedes ``call`` in ``fn``'s body
    (a modulo, or the accumulation count in the test)."""
    at = getattr(call, "lineno", 0)
    for stmt in fn.body:
        if getattr(stmt, "lineno", at) >= at:
            break
        if isinstance(stmt, ast.If) and any(isinstance(n, ast.Return) for n in stmt.body):
            test = ast.unparse(stmt.test)
            if "%" in test or "accumulate" in test:
                return True
    return False


def _ints(ctx: FileContext, expr: ast.AST) -> set[int | None]:
    """:meth:`int_candidates`, reading ``hp["k"]`` through a parameter whose default names a
    module dict (``def main(hp=HPARAMS)``)."""
    got = ctx.int_candidates(expr)
    if None not in got or not (isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name)):
        return got
    fn = ctx.enclosing(expr, FUNCS)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return got
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]],
                        fn.args.defaults, strict=True))
    default = defaults.get(expr.value.id)
    if not isinstance(default, ast.Name):
        return got
    swapped = ast.Subscript(value=ast.Name(id=default.id, ctx=ast.Load()), slice=expr.slice,
                            ctx=ast.Load())
    return ctx.int_candidates(swapped)


def _validation_mid_window(ctx: FileContext) -> dict[str, int]:
    """The validation hooks (each with the interval) when the Trainer validates every N
    training batches (``val_check_interval=N``) with N not a multiple of every K in sight:
    validation then runs inside a window. Empty when either is not in sight."""
    ks: set[int | None] = set()
    vs: set[int | None] = set()
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg == "accumulate_grad_batches":
                ks |= _ints(ctx, kw.value)
            elif kw.arg == "val_check_interval":
                vs |= _ints(ctx, kw.value)
    if not ks or not vs or None in ks or None in vs:
        return {}
    if all(v % k == 0 for v in vs if v for k in ks if k):
        return {}
    every = min(v for v in vs if v)
    return dict.fromkeys(_VALIDATION_HOOKS, every)


@rule("AG192")
def zero_grad_in_per_batch_lightning_hook(ctx: FileContext) -> Iterator[Finding]:
    if not accumulation_given(ctx):
        return
    mid = _validation_mid_window(ctx)
    for fn in ctx.of(ast.FunctionDef):
        if not isinstance(fn, ast.FunctionDef) or fn.name not in (*LIGHTNING_PER_BATCH, *mid) \
                or ctx.enclosing(fn, (ast.ClassDef,)) is None:
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and call_attr(call) == "zero_grad"):
                continue
            if ctx.enclosing(call, (ast.If, ast.IfExp)) is not None \
                    and ctx.enclosing(ctx.enclosing(call, (ast.If, ast.IfExp)) or call, FUNCS) is fn:
                continue  # (under a condition: between windows, judged elsewhere)
            if _returns_off_boundary(fn, call):
                continue  # (`if (batch_idx + 1) % K != 0: return` before it: at boundaries only)
            when = (f"which Lightning calls at each validation, every {mid[fn.name]} "
                    "training batches (val_check_interval), not a multiple of "
                    "accumulate_grad_batches, so inside a window" if fn.name in mid else
                    "which Lightning calls on every batch")
            yield ctx.finding(
                "AG192",
                call,
                f"`{ast.unparse(call)}` runs in `{fn.name}`, {when}, while the Trainer "
                "accumulates (accumulate_grad_batches): it clears the "
                "gradient the window has summed so far, so each optimizer step receives only "
                "the gradient of the batches after the last clear",
            )
            return


#: the Hugging Face Trainer's callback hooks that run while training, between windows or
#: inside one: a gradient left there is added to a window's sum
_HF_TRAINING_HOOKS = ("on_step_begin", "on_step_end", "on_substep_end", "on_pre_optimizer_step",
                      "on_optimizer_step", "on_epoch_begin", "on_epoch_end", "on_log",
                      "on_evaluate", "on_save")


def _callback_class(cls: ast.ClassDef) -> bool:
    return any((dotted(b) or "").rsplit(".", 1)[-1] == "TrainerCallback" for b in cls.bases)


@rule("AG371")
def backward_left_in_a_trainer_callback(ctx: FileContext) -> Iterator[Finding]:
    """AG371 (F7): a ``TrainerCallback`` hook runs a backward of its own (a probe batch's
    gradient norm, a sensitivity measure) and clears nothing after it. The Trainer clears
    the gradient only after each optimizer step, so what the probe left in ``.grad`` is added
    to the next window's sum (``on_step_end``, ``on_step_begin``) or to the current one's
    (``on_substep_end``, ``on_pre_optimizer_step``): that update is not the large batch's."""
    for cls in ctx.of(ast.ClassDef):
        if not _callback_class(cls):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name not in _HF_TRAINING_HOOKS:
                continue
            calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)),
                           key=lambda n: (n.lineno, n.col_offset))
            backs = [c for c in calls if call_attr(c) == "backward"
                     and (dotted(receiver(c)) or "") not in ("accelerator", "self.accelerator")]
            if not backs:
                continue
            last = backs[-1]
            cleared = any((call_attr(c) in ("zero_grad", "zero_") and "grad" in ast.unparse(c))
                          or call_attr(c) == "zero_grad"
                          for c in calls if (c.lineno, c.col_offset) > (last.lineno, last.col_offset))
            cleared = cleared or any(
                isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "grad"
                                                  for t in n.targets)
                and isinstance(n.value, ast.Constant) and n.value.value is None
                and n.lineno > last.lineno for n in ast.walk(fn))
            if cleared:
                continue
            when = ("the next window's" if fn.name in ("on_step_end", "on_step_begin", "on_epoch_begin",
                                                      "on_epoch_end", "on_log", "on_evaluate",
                                                      "on_save", "on_optimizer_step")
                    else "this window's")
            yield ctx.finding(
                "AG371", last,
                f"`{ast.unparse(last)}` in the callback's `{fn.name}` leaves its gradient in "
                f".grad (nothing clears it after): the Trainer clears only after each optimizer "
                f"step, so it is added to {when} sum and that update is not the large batch's",
                fix="clear what the probe left (`model.zero_grad(set_to_none=True)` after "
                    "reading it), or compute it with torch.autograd.grad, which leaves .grad "
                    "alone")
            return
