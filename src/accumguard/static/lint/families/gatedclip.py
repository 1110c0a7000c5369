"""A step helper that clips on every call but steps only when told to (F8): AG324.

A loss-scaler helper in timm's style runs the backward on every micro-batch and takes a flag
for the window's boundary (``need_update``): the optimizer step belongs under the flag, and
so does the clip (and GradScaler's ``unscale_``), which must see the window's whole
gradient once. A helper whose step is gated by its flag parameter while its clip is not
clips the partial sum after every micro-batch of the window. Reported when, in one
function, a backward comes first, the optimizer (or GradScaler) step runs only under an
``if`` on a parameter of that function, a clipping call after the backward is outside that
``if``, and a call of the function in the file passes that parameter something other than a
constant true.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import CLIP_FUNCS, FUNCS, call_attr, dotted, is_backward, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["helper_clips_every_call_steps_on_flag"]


def _flag_of(test: ast.AST, params: list[str]) -> str | None:
    if isinstance(test, ast.Name) and test.id in params:
        return test.id
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return next((f for v in test.values if (f := _flag_of(v, params))), None)
    return None


def _under(ctx: FileContext, node: ast.AST, fn: ast.AST) -> list[ast.If]:
    out: list[ast.If] = []
    cur = ctx.parents.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, ast.If):
            out.append(cur)
        cur = ctx.parents.get(cur)
    return out


def _passes_flag(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef, flag: str) -> bool:
    """Some call of ``fn`` in the file gives ``flag`` a value that is not a constant true."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    idx = params.index(flag) - (1 if params and params[0] == "self" else 0)
    holders = _instances_of_callable(ctx, fn)
    for call in ctx.of(ast.Call):
        if ctx.callee_of(call) is not fn and (dotted(call.func) or "") not in holders:
            continue
        arg = next((k.value for k in call.keywords if k.arg == flag),
                   call.args[idx] if 0 <= idx < len(call.args) else None)
        if arg is not None and not (isinstance(arg, ast.Constant) and arg.value is True):
            return True
    return False


def _instances_of_callable(ctx: FileContext, fn: ast.AST) -> set[str]:
    """For a ``__call__``: the names (``self.loss_scaler``) assigned an instance of its class."""
    cls = ctx.enclosing(fn, (ast.ClassDef,))
    if getattr(fn, "name", "") != "__call__" or not isinstance(cls, ast.ClassDef):
        return set()
    out: set[str] = set()
    for n in ctx.of(ast.Assign):
        if isinstance(n.value, ast.Call) and (dotted(n.value.func) or "").rsplit(".", 1)[-1] == cls.name:
            out |= {d for t in n.targets if (d := dotted(t))}
    return out


@rule("AG324")
def helper_clips_every_call_steps_on_flag(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(*FUNCS):
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        calls = [n for n in walk_all(fn) if isinstance(n, ast.Call)]
        backs = [c for c in calls if is_backward(c)]
        if not backs:
            continue
        first = min(c.lineno for c in backs)
        steps = [c for c in calls if call_attr(c) == "step" and ctx.is_step(c, ("optimizer", "scaler"))]
        flags = {f for s in steps for i in _under(ctx, s, fn) if (f := _flag_of(i.test, params))}
        if len(flags) != 1 or not steps:
            continue
        flag = flags.pop()
        if not all(any(_flag_of(i.test, params) == flag for i in _under(ctx, s, fn)) for s in steps):
            continue
        clips = [c for c in calls if call_attr(c) in CLIP_FUNCS and c.lineno > first
                 and not any(_flag_of(i.test, params) == flag for i in _under(ctx, c, fn))]
        if not clips or not _passes_flag(ctx, fn, flag):
            continue
        yield ctx.finding(
            "AG324", clips[0],
            f"`{ast.unparse(clips[0].func)}` in `{fn.name}` runs on every call, after its "
            f"backward, while the optimizer step runs only when `{flag}` is true (the "
            "window's boundary): every micro-batch clips the partial sum of the window "
            "instead of the window's gradient once")
