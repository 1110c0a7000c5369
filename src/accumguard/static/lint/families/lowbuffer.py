"""AG197 (F12): a hand-made gradient accumulation buffer created in bf16/fp16.

A loop that folds each micro-step's gradients into buffers of its own (``bufs = [torch.
zeros_like(p, dtype=cfg.accum_dtype) for p in params]`` ... ``buf.add_(g)`` for the
gradients of ``torch.autograd.grad`` or ``p.grad``) sums the window in the buffers' dtype:
with bf16/fp16 buffers every micro-batch is rounded into the sum, a drift that grows like
u*sqrt(K), while the large batch sums its gradient once in fp32. The dtype is read where the
file gives it: a literal, a module constant, a config class field's default (and every
keyword that sets that field), an argparse default naming a low dtype; any value that is not
bf16/fp16, or not in sight, leaves the buffer alone. An error when every K in sight for the
micro-step loop is at least the watch rule's bound (:func:`accumguard.core.precision.
f12_error_k`), a warning when K is not in sight.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.core.precision import f12_error_k
from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, last_part
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import k_values, param_arguments

_MAKERS = frozenset({"zeros_like", "zeros", "empty_like", "empty", "full_like", "full",
                     "new_zeros", "new_empty", "new_full"})
_LOW = frozenset({"bfloat16", "float16", "half", "bf16", "fp16"})
_ERROR_K = f12_error_k()


def _dtype_names(ctx: FileContext, expr: ast.AST) -> set[str | None]:
    """The dtype names (last part, ``"bfloat16"``) the file gives ``expr``; None for a value
    not in sight."""
    def compute() -> dict[str, set[str | None]]:
        out: dict[str, set[str | None]] = {}

        def put(key: str, value: ast.AST | None) -> None:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                name: str | None = value.value.lower()
            else:
                d = dotted(value) if value is not None else None
                name = last_part(d) if d and d.startswith(("torch.", "th.")) else None
            out.setdefault(key, set()).add(name)

        for cls in ctx.of(ast.ClassDef):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    put("." + stmt.target.id, stmt.value)
        for node in ctx.of(ast.Assign):
            for t in node.targets:
                if (d := dotted(t)) is not None:
                    put(d if "." not in d else "." + last_part(d), node.value)
        for call in ctx.of(ast.Call):
            if call_attr(call) == "add_argument":
                dest = next((a.value for a in call.args if isinstance(a, ast.Constant)
                             and isinstance(a.value, str) and a.value.startswith("--")), None)
                default = next((k.value for k in call.keywords if k.arg == "default"), None)
                if isinstance(dest, str):
                    put("." + dest.lstrip("-").replace("-", "_"), default)
            for kw in call.keywords:
                if kw.arg is not None:
                    put("." + kw.arg, kw.value)
        return out

    table: dict[str, set[str | None]] = ctx._cached("lowbuffer_dtypes", ctx.tree, compute)
    d = dotted(expr)
    if d is None:
        return {None}
    if d.startswith(("torch.", "th.")):
        return {last_part(d)}
    return table.get(d if "." not in d else "." + last_part(d), {None})


def _constructor_arguments(ctx: FileContext, init: ast.FunctionDef | ast.AsyncFunctionDef,
                           name: str) -> list[ast.AST | None]:
    """What the file's ``Cls(...)`` calls pass for ``__init__``'s parameter ``name`` (None
    for a call that passes it out of sight)."""
    cls = ctx.enclosing(init, (ast.ClassDef,))
    if not isinstance(cls, ast.ClassDef):
        return [None]
    params = [a.arg for a in init.args.args][1:]
    i = params.index(name)
    out: list[ast.AST | None] = []
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != cls.name:
            continue
        kw = next((k.value for k in call.keywords if k.arg == name), None)
        if kw is not None:
            out.append(kw)
        elif i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
            out.append(call.args[i])
        else:
            out.append(None)
    return out or [None]


def _low(ctx: FileContext, expr: ast.AST | None) -> bool:
    names = _dtype_names(ctx, expr) if expr is not None else {None}
    if names == {None} and isinstance(expr, ast.Name):
        # a parameter of the function around it (`def __init__(self, params, dtype)`): what
        # the file's calls of that function pass for it
        fn = ctx.enclosing(expr, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) \
                and expr.id in {a.arg for a in fn.args.args}:
            passed = _constructor_arguments(ctx, fn, expr.id) if fn.name == "__init__" \
                else param_arguments(ctx, fn, expr.id)
            names = set().union(*(_dtype_names(ctx, a) if a is not None else {None}
                                  for a in passed)) if passed else {None}
    return bool(names) and all(n is not None and n in _LOW for n in names)


def _maker(ctx: FileContext, node: ast.AST) -> bool:
    """``torch.zeros_like(p, dtype=<bf16>)`` and its kin, or a maker cast ``.to(<bf16>)``,
    ``.bfloat16()``, ``.half()``."""
    if not isinstance(node, ast.Call):
        return False
    attr = call_attr(node)
    if attr in _MAKERS:
        return _low(ctx, next((k.value for k in node.keywords if k.arg == "dtype"), None))
    inner = node.func.value if isinstance(node.func, ast.Attribute) else None
    if not (isinstance(inner, ast.Call) and call_attr(inner) in _MAKERS):
        return False
    if attr in ("bfloat16", "half") and not node.args:
        return True
    return attr == "to" and any(_low(ctx, a) for a in [
        *node.args, *(k.value for k in node.keywords if k.arg == "dtype")])


def _buffers(ctx: FileContext) -> dict[str, ast.Assign]:
    """Names bound to a low-precision buffer, or to a list/dict comprehension of them."""
    out: dict[str, ast.Assign] = {}
    for node in ctx.of(ast.Assign):
        v = node.value
        elt = v.elt if isinstance(v, ast.ListComp | ast.GeneratorExp) else \
            v.value if isinstance(v, ast.DictComp) else v
        if _maker(ctx, elt):
            for t in node.targets:
                if (d := dotted(t)) is not None:
                    out[d] = node
    return out


def _grad_source(ctx: FileContext, expr: ast.AST, depth: int = 0) -> bool:
    """``expr`` reads a gradient: a ``.grad``, a ``torch.autograd.grad`` result, or a name
    assigned (or zipped in a loop) from one."""
    if depth > 3:
        return False
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute) and n.attr == "grad":
            return True
        if isinstance(n, ast.Call) and dotted(n.func) in ("torch.autograd.grad", "autograd.grad"):
            return True
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if any(_grad_source(ctx, v, depth + 1) for v in ctx.values_by_name().get(n.id, [])
                   if v is not None):
                return True
            partner = _zip_partner(ctx, n)
            if partner is not None and _grad_source(ctx, partner, depth + 1):
                return True
    return False


def _loop_of(ctx: FileContext, name: ast.Name) -> tuple[ast.For, int | None] | None:
    """The ``for`` whose target binds ``name`` and its position in a tuple target."""
    cur = ctx.parents.get(name)
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, ast.For):
            t = cur.target
            if isinstance(t, ast.Name) and t.id == name.id:
                return cur, None
            if isinstance(t, ast.Tuple):
                for i, e in enumerate(t.elts):
                    if isinstance(e, ast.Name) and e.id == name.id:
                        return cur, i
        cur = ctx.parents.get(cur)
    return None


def _zip_partner(ctx: FileContext, name: ast.Name) -> ast.AST | None:
    """What a loop variable iterates: ``for buf, g in zip(bufs, grads)`` gives ``grads`` for
    ``g``, ``for g in grads`` gives ``grads``."""
    found = _loop_of(ctx, name)
    if found is None:
        return None
    loop, i = found
    it = loop.iter
    if i is None:
        return it
    if isinstance(it, ast.Call) and dotted(it.func) == "zip" and i < len(it.args):
        return it.args[i]
    return None


def _added_buffer(ctx: FileContext, node: ast.AST, bufs: dict[str, ast.Assign]) -> tuple[str, ast.AST] | None:
    """(buffer name, value added) of ``buf.add_(v)`` / ``buf += v`` on a buffer, an element
    of one, or a loop variable over one."""
    if isinstance(node, ast.Call) and call_attr(node) == "add_" and node.args \
            and isinstance(node.func, ast.Attribute):
        target, value = node.func.value, node.args[0]
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        target, value = node.target, node.value
    else:
        return None
    if isinstance(target, ast.Subscript):
        target = target.value
    d = dotted(target)
    if d in bufs:
        return d, value
    if isinstance(target, ast.Name):
        it = _zip_partner(ctx, target)
        if it is not None:
            if isinstance(it, ast.Call) and call_attr(it) in ("values", "items"):
                it = it.func.value if isinstance(it.func, ast.Attribute) else it
            if (di := dotted(it)) in bufs:
                return di, value
    return None


def _micro_loops(ctx: FileContext, node: ast.AST) -> list[ast.For]:
    """``for _ in range(K)`` loops that run ``node`` once per micro-step: around it, or
    around a call of the function it is in (one level)."""
    out: list[ast.For] = []
    for start in [node, *ctx.call_sites(fn)] if (fn := ctx.enclosing(node, FUNCS)) else [node]:
        cur = ctx.parents.get(start)
        while cur is not None and not isinstance(cur, FUNCS):
            if isinstance(cur, ast.For) and isinstance(cur.iter, ast.Call) \
                    and call_attr(cur.iter) == "range" and len(cur.iter.args) == 1:
                out.append(cur)
                break
            cur = ctx.parents.get(cur)
    return out


@rule("AG197")
def low_precision_hand_buffer(ctx: FileContext) -> Iterator[Finding]:
    bufs = _buffers(ctx)
    if not bufs:
        return
    seen: set[str] = set()
    for node in ctx.of(ast.Call, ast.AugAssign):
        hit = _added_buffer(ctx, node, bufs)
        if hit is None or hit[0] in seen or not _grad_source(ctx, hit[1]):
            continue
        loops = _micro_loops(ctx, node)
        if not loops:
            continue
        ks: set[int | None] = set()
        for loop in loops:
            assert isinstance(loop.iter, ast.Call)
            ks |= k_values(ctx, loop.iter.args[0], loop)
        known = sorted(k for k in ks if k is not None)
        if known and None not in ks and max(known) < 2:
            continue
        seen.add(hit[0])
        error = bool(known) and None not in ks and min(known) >= _ERROR_K
        k_text = f"K = {known[0]}" if len(known) == 1 and None not in ks else \
            "K (its value not in sight)"
        made = bufs[hit[0]]
        finding = ctx.finding(
            "AG197", node,
            f"`{hit[0]}` (line {made.lineno}) holds bf16/fp16 buffers and each micro-step's "
            f"gradient is added into them here, over the {k_text} micro-steps of the loop at "
            f"line {loops[0].lineno}: the window's sum is rounded to that dtype at every "
            "micro-step, a drift that grows like sqrt(K), while the large batch sums its "
            "gradient once in fp32"
            + (f" (an error from K >= {_ERROR_K}, the watch rule's bound)" if error else ""))
        if error:
            finding = replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)
        yield finding
