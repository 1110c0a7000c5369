"""AG199 (F6): a count all-reduced through a temporary copy.

``dist.all_reduce`` reduces its tensor in place. Given a new tensor made on the spot
(``dist.all_reduce(n.float())`` with ``n`` an integer tensor, ``n.clone()``,
``torch.tensor(count)``, ``n * 1.0``), it sums into that copy, which nothing keeps: the
script's ``n`` stays this rank's own count, and a loss divided by it is normalised per rank
(each rank's tokens weigh 1 / its own count, the F6 pattern) where the large batch divides
by the count over all ranks. Judged only where the value is named like a count and the
argument is a copy for certain: a
``clone()``, a tensor built in the call, arithmetic, or a dtype conversion of a name the
file made as an integer tensor (``torch.tensor(sum(...))`` of ints, ``dtype=torch.long``);
``.float()`` of a float tensor returns the tensor itself and is not judged. Gradients
reduced into copies are AG193's.

AG352 (F6): a count handed to Lightning's strategy reduction as a Python number
(``self.trainer.strategy.reduce(float(n))``, ``strategy.reduce(n.item())``). Lightning's
strategies reduce tensors only and return anything else unchanged: the value stays this
rank's own count, and a loss divided by it is normalised per rank where the script meant the
count over all ranks. (Fabric's ``all_reduce`` turns numbers into tensors first: not this.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import COUNT_NAME_RE, FUNCS, call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_REDUCERS = ("all_reduce",)
_CASTS = ("float", "double", "half", "bfloat16", "to")
_MAKERS = ("tensor", "as_tensor", "stack", "cat", "zeros", "ones", "full")
_INT_DTYPES = ("long", "int64", "int32", "int", "int16", "int8", "uint8")


def _int_made(value: ast.AST) -> bool:
    """``torch.tensor(<integer expression>)`` without a float dtype, any tensor maker given
    an integer dtype, ``(labels != -100).sum()`` (a count of a boolean mask),
    ``x.long()``, ``torch.count_nonzero(...)``, Python's ``sum`` of such counts."""
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Name) and value.func.id == "sum" and len(value.args) == 1 \
            and isinstance(value.args[0], ast.GeneratorExp | ast.ListComp) \
            and _int_made(value.args[0].elt):
        return True  # Python's sum of integer tensors (the window's mask counts) is one
    attr = call_attr(value)
    if attr in ("long", "int", "count_nonzero") and (attr == "count_nonzero" or not value.args):
        return True
    if attr == "sum" and not value.args and (
            isinstance(r := receiver(value), ast.Compare)
            or (isinstance(r, ast.Call) and call_attr(r) in ("ne", "eq", "gt", "ge", "lt", "le"))):
        return True
    if attr not in _MAKERS:
        return False
    dtype = next((k.value for k in value.keywords if k.arg == "dtype"), None)
    if dtype is not None:
        return (dotted(dtype) or "").split(".")[-1] in _INT_DTYPES
    if call_attr(value) not in ("tensor", "as_tensor") or len(value.args) != 1:
        return False
    arg = value.args[0]
    if isinstance(arg, ast.Constant):
        return type(arg.value) is int
    calls = {dotted(n.func) for n in ast.walk(arg) if isinstance(n, ast.Call)}
    floats = any(isinstance(n, ast.Constant) and type(n.value) is float for n in ast.walk(arg)) \
        or any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(arg)) \
        or "float" in calls
    return not floats and bool(calls & {"int", "len"})


def _copy(ctx: FileContext, arg: ast.AST, scope: ast.AST) -> str | None:
    """Why ``arg`` is a new tensor (None when it may be the tensor itself)."""
    if isinstance(arg, ast.BinOp):
        return "arithmetic makes a new tensor"
    if not isinstance(arg, ast.Call):
        return None
    attr = call_attr(arg)
    if attr == "clone":
        return "`clone()` makes a new tensor"
    if attr in _MAKERS and dotted(arg.func) != attr:
        return f"`{ast.unparse(arg.func)}(...)` makes a new tensor"
    base = receiver(arg)
    if attr in _CASTS and isinstance(base, ast.Name):
        if attr == "to" and not any((dotted(a) or "").startswith("torch.float") for a in arg.args):
            return None
        made = [(a, v) for a, t, v in _assignments(ctx, scope) if t == base.id]
        if len(made) == 1 and _int_made(made[0][1]):
            return (f"`{base.id}` is an integer tensor (line {made[0][0].lineno}), so "
                    f"`{ast.unparse(arg)}` is a converted copy")
    return None


def _assignments(ctx: FileContext, scope: ast.AST) -> list[tuple[ast.Assign, str, ast.AST]]:
    return [(n, t.id, n.value) for n in ctx.local_nodes(scope) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)]


def _count_like(arg: ast.AST) -> bool:
    """The reduced value is named like a count (``n``, ``ntok``, ``num_items``)."""
    return any(COUNT_NAME_RE.match(x) for x in (
        [n.id for n in ast.walk(arg) if isinstance(n, ast.Name)]
        + [n.attr for n in ast.walk(arg) if isinstance(n, ast.Attribute)]))


@rule("AG199")
def count_reduced_through_a_copy(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) not in _REDUCERS or not call.args:
            continue
        parent = ctx.parents.get(call)
        if not isinstance(parent, ast.Expr):
            continue  # (its result kept: an async work handle, a wrapper returning the value)
        arg = call.args[0]
        if any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(arg)) \
                or not _count_like(arg):
            continue  # gradients: AG193; a loss or a flag reduced to synchronise: not a count
        scope = ctx.enclosing(call, FUNCS) or ctx.tree
        why = _copy(ctx, arg, scope)
        if why is None:
            continue
        finding = ctx.finding(
            "AG199", call,
            f"`{ast.unparse(call)}` reduces in place into a copy: {why}, which nothing keeps, "
            "so the value the script goes on using is this rank's own; a loss normalised by "
            "it is divided by each rank's own count where the large batch divides by the "
            "count over all ranks")
        yield replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)


def _python_number(arg: ast.AST) -> str | None:
    """Why ``arg`` is a Python number, not a tensor: a literal, ``float(...)``/``int(...)``/
    ``len(...)``, ``x.item()``; else None."""
    if isinstance(arg, ast.Constant) and type(arg.value) in (int, float):
        return "a number literal"
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in ("float", "int", "len"):
        return f"`{arg.func.id}(...)`, a Python number"
    if isinstance(arg, ast.Call) and call_attr(arg) in ("item", "tolist") and not arg.args:
        return f"`.{call_attr(arg)}()`, a Python number"
    return None


def _framework_reduce(call: ast.Call) -> str | None:
    """``<...>.strategy.reduce(x)`` (Lightning's): its words."""
    name = dotted(call.func) or ""
    if call_attr(call) == "reduce" and name.rsplit(".", 1)[0].endswith("strategy"):
        return "Lightning's strategy.reduce"
    return None


@rule("AG352")
def count_reduced_as_a_python_number(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        who = _framework_reduce(call)
        why = _python_number(call.args[0]) if who is not None else None
        if who is None or why is None:
            continue
        yield ctx.finding(
            "AG352", call,
            f"`{ast.unparse(call)}` hands {who} {why}: it reduces tensors only and returns "
            "anything else unchanged, so the value stays this rank's own; a loss divided by "
            "it is normalised per rank, not by the count over all ranks",
            fix="reduce a tensor: `strategy.reduce(torch.tensor(float(n), device=self.device), "
                "reduce_op=\"sum\")`, and use what it returns")
