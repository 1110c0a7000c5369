"""Which micro-step of the window a sync flag's or a step's test names, read from the
source (the facts the F11 rules of :mod:`.sync` compare): a counter from 0 and a test true
at its first value only (``micro == 0``, ``c % K == 0``), a test no iteration reaches
(``micro == K`` under ``range(K)``), and the residue modulo K of a flag's test against the
optimizer step's, counting the ``counter += 1`` between them."""

from __future__ import annotations

import ast
import re

from accumguard.static.lint._ast import ACCUM_RE, FUNCS, LOOPS, SCOPES, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._modguard import call_test

__all__ = ["first_test", "never_true", "off_the_step", "shown", "step_gates", "through_name",
           "zero_based_counter"]


#: a micro-step *counter* (``micro_step``, ``accum_idx``), not a flag (``accumulating``)
_COUNTER_RE = re.compile(r"step|idx|index|iter|count|_i$|_j$")


def zero_based_counter(ctx: FileContext, expr: ast.AST) -> str | None:
    """The name of ``expr`` when it counts the micro-steps of a window from 0: the target of an
    enclosing ``for c in range(n)`` / ``range(0, n)`` / ``for c, _ in enumerate(x)``, or a
    micro-step name (``micro_step``, ``accum_idx``) that is no other loop's variable."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        return _self_counter(ctx, expr)
    if not isinstance(expr, ast.Name):
        return None
    name = expr.id
    cur = ctx.parents.get(expr)
    while cur is not None and not isinstance(cur, SCOPES):
        if isinstance(cur, ast.For | ast.AsyncFor):
            it, tgt = cur.iter, cur.target
            if isinstance(tgt, ast.Name) and tgt.id == name:
                ok = isinstance(it, ast.Call) and dotted(it.func) == "range" and (
                    len(it.args) == 1
                    or (len(it.args) == 2 and isinstance(it.args[0], ast.Constant) and it.args[0].value == 0)
                )
                return name if ok else None
            if (
                isinstance(tgt, ast.Tuple) and tgt.elts and isinstance(tgt.elts[0], ast.Name)
                and tgt.elts[0].id == name
            ):
                ok = (
                    isinstance(it, ast.Call) and dotted(it.func) == "enumerate"
                    and len(it.args) == 1 and not it.keywords
                )
                return name if ok else None
        cur = ctx.parents.get(cur)
    low = name.lower()
    if not (ACCUM_RE.search(low) and _COUNTER_RE.search(low)):
        return None
    loop = ctx.enclosing(expr, (ast.For, ast.AsyncFor, ast.While))
    line = getattr(expr, "lineno", None)
    if loop is not None and line is not None and any(
            isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id == name
            and n.lineno < line for n in ast.walk(loop)):
        return None  # `micro_step += 1` before the test: it counts from 1 there
    return name


def _self_counter(ctx: FileContext, expr: ast.Attribute) -> str | None:
    """``self.micro_step``: a micro-step counter by its name, set to 0 somewhere in the
    class, and not incremented before the test in the method that reads it."""
    low = expr.attr.lower()
    if not ACCUM_RE.search(low):
        return None
    cls = ctx.enclosing(expr, (ast.ClassDef,))
    fn = ctx.enclosing(expr, (ast.FunctionDef, ast.AsyncFunctionDef))
    if cls is None or fn is None:
        return None
    target = f"self.{expr.attr}"
    if not _COUNTER_RE.search(low) and not _counts_by_one(cls, target):
        return None  # (`self.micro` without a counter's name: a counter by how it is set)
    zeroed = any(isinstance(n, ast.Assign) and any(dotted(t) == target for t in n.targets)
                 and isinstance(n.value, ast.Constant) and n.value.value == 0 for n in ast.walk(cls))
    line = getattr(expr, "lineno", 0)
    bumped = any(isinstance(n, ast.AugAssign) and dotted(n.target) == target and n.lineno < line
                 for n in ast.walk(fn))
    return target if zeroed and not bumped else None


def _counts_by_one(cls: ast.AST, target: str) -> bool:
    """``target`` is only ever set to 0 and incremented by 1 in ``cls``."""
    seen = False
    for n in ast.walk(cls):
        if isinstance(n, ast.Assign) and any(dotted(t) == target for t in n.targets):
            if not (isinstance(n.value, ast.Constant) and n.value.value == 0):
                return False
        elif isinstance(n, ast.AugAssign | ast.AnnAssign) and dotted(n.target) == target:
            if not (isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
                    and isinstance(n.value, ast.Constant) and n.value.value == 1):
                return False
            seen = True
    return seen


def predicate_at_call(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """The one ``return`` expression of the function of the file ``call`` runs (a boundary
    helper such as ``def should_sync(self, i): return i % K == 0``), its parameters replaced
    by the call's arguments (the call site's own nodes, so counters are read where they
    live); None when the function is not one plain return or an argument is missing."""
    fn = ctx.callee_of(call)
    if not isinstance(fn, ast.FunctionDef):
        return None
    body = [b for b in fn.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
        params = params[1:]
    if len(call.args) > len(params):
        return None
    given: dict[str, ast.AST] = dict(zip(params, call.args, strict=False))
    given.update({k.arg: k.value for k in call.keywords if k.arg})

    class _Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return given.get(node.id, node)

    return _Sub().visit(ast.parse(ast.unparse(body[0].value), mode="eval").body)  # type: ignore[no-any-return]


def first_test(ctx: FileContext, expr: ast.AST) -> bool | None:
    """True when ``expr`` is truthy at the *first* micro-step of a window only (``c == 0``,
    ``not c``, ``c < 1``, ``c % K == 0``, ``not c % K`` with ``c`` counting from 0); False when
    it is truthy on every micro-step but the first (``c != 0``, ``c > 0``, ``c``, ``c % K``);
    None otherwise. Either way it is not the last micro-step's test (K > 1)."""
    def counter_or_mod(x: ast.AST) -> bool:
        if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mod):
            x = x.left
        return zero_based_counter(ctx, x) is not None

    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = first_test(ctx, expr.operand)
        return None if inner is None else not inner
    if isinstance(expr, ast.Call) and (body := predicate_at_call(ctx, expr)) is not None:
        return first_test(ctx, body)  # `self.should_sync(i)`: its one return, read at the call
    if isinstance(expr, ast.Name) or (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod)):
        return False if counter_or_mod(expr) else None
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        left, op, right = expr.left, expr.ops[0], expr.comparators[0]
        if isinstance(left, ast.Constant):
            left, right = right, left
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
        if not (isinstance(right, ast.Constant) and type(right.value) is int):
            return None
        v = right.value
        if v == 0 and isinstance(op, ast.Eq | ast.NotEq | ast.Gt):
            return isinstance(op, ast.Eq) if counter_or_mod(left) else None
        if zero_based_counter(ctx, left) is None:
            return None
        if (isinstance(op, ast.Lt) and v == 1) or (isinstance(op, ast.LtE) and v == 0):
            return True
        if isinstance(op, ast.GtE) and v == 1:
            return False
    return None


def through_name(ctx: FileContext, scope: ast.AST, expr: ast.AST) -> ast.AST:
    """A name ``scope`` assigns once read as its value (``is_boundary = micro % K == 0``);
    anything else as it is."""
    if isinstance(expr, ast.Name):
        values = ctx.assigned_in(scope).get(expr.id, [])
        if len(values) == 1:
            return values[0]
    return expr


def step_gates(ctx: FileContext, scope: ast.AST) -> list[ast.If]:
    """The ``if`` statements of ``scope``'s own code that gate an optimizer step (cached)."""
    gates: list[ast.If] = ctx._cached("sync_gates", scope, lambda: [
        g for g in ctx.local_nodes(scope) if isinstance(g, ast.If) and ctx._gates_step(g)])
    return gates


def _residue(ctx: FileContext, expr: ast.AST, scope: ast.AST) -> tuple[str, str, int] | None:
    """(counter, K, r) of a test ``(c + a) % K == b`` (``b`` an integer or ``K - n``): true
    when ``c`` is ``r = b - a`` modulo K. A name is read through its one assignment in
    ``scope`` (``is_boundary = micro % K == 0``)."""
    expr = through_name(ctx, scope, expr)
    expr = call_test(ctx, expr) or expr  # `is_sync_step(micro, K)`: the predicate's test
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq)):
        return None
    left, right = expr.left, expr.comparators[0]
    if isinstance(right, ast.BinOp) and isinstance(right.op, ast.Mod):
        left, right = right, left
    if not (isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod)):
        return None
    k = ast.dump(left.right)
    counter, shift = left.left, 0
    if isinstance(counter, ast.BinOp) and isinstance(counter.op, ast.Add | ast.Sub) \
            and isinstance(counter.right, ast.Constant) and type(counter.right.value) is int:
        shift = counter.right.value if isinstance(counter.op, ast.Add) else -counter.right.value
        counter = counter.left
    name = dotted(counter)
    if name is None:
        return None
    if isinstance(right, ast.Constant) and type(right.value) is int:
        r = right.value
    elif isinstance(right, ast.BinOp) and isinstance(right.op, ast.Sub) \
            and ast.dump(right.left) == k and isinstance(right.right, ast.Constant) \
            and type(right.right.value) is int:
        r = -right.right.value
    else:
        return None
    return name, k, r - shift


def off_the_step(ctx: FileContext, node: ast.AST, value: ast.AST) -> tuple[str, str] | None:
    """(the sync test, the step's test) when the sync flag is on at another micro-step than
    the one the optimizer steps at: both tests read the same counter modulo the same K with
    different residues (``set_requires_gradient_sync(micro % K == 1)`` beside ``if micro % K
    == 0: opt.step()``)."""
    scope = ctx.enclosing(node, FUNCS) or ctx.tree
    sync = _residue(ctx, value, scope)
    if sync is None:
        return None
    tests = [g.test for g in step_gates(ctx, scope)] + _returned_step_tests(ctx, scope)
    for test in tests:
        step = _residue(ctx, test, scope)
        if step is None or step[:2] != sync[:2]:
            continue
        # `c += 1` between the flag and the step's test: the test reads the counter later
        # (each test where it is evaluated: a flag's name where it is assigned)
        r_step = step[2] - _increments_between(ctx, scope, sync[0], through_name(ctx, scope, value),
                                               through_name(ctx, scope, test))
        if r_step == sync[2]:
            continue
        k = ctx.int_value(test.left.right) if (  # the K the tests share, when in sight
            isinstance(test, ast.Compare) and isinstance(test.left, ast.BinOp)) else None
        diff = abs(r_step - sync[2])
        if diff == 1 or (k is not None and k > 1 and diff % k != 0):
            step_text = shown(ctx, scope, test)
            if r_step != step[2]:
                step_text += f"` after `{sync[0]} += {step[2] - r_step}"  # read one micro-step on
            return shown(ctx, scope, value), step_text
    return None


def _returned_step_tests(ctx: FileContext, scope: ast.AST) -> list[ast.AST]:
    """The tests ``scope`` returns (``return self.micro % self.k == 0``) when every call of
    it the file makes is the test of an ``if`` that gates an optimizer step (``if
    acc.backward(loss): opt.step()``): the step's test, written in the helper."""
    if not isinstance(scope, FUNCS):
        return []
    owner = ctx.parents.get(scope)
    sites = ctx.call_sites(scope) + ([  # `acc.backward(loss)` with `acc = GradAccumulator(...)`
        c for c in ctx.of(ast.Call) if isinstance(c.func, ast.Attribute) and c.func.attr == scope.name
        and ctx._instances().get(dotted(c.func.value) or "") is owner] if isinstance(owner, ast.ClassDef)
        else [])
    if not sites or not all(isinstance(gate := ctx.parents.get(c), ast.If) and gate.test is c
                            and ctx._gates_step(gate) for c in sites):
        return []
    return [n.value for n in ctx.local_nodes(scope) if isinstance(n, ast.Return)
            and isinstance(n.value, ast.Compare)]


def _increments_between(ctx: FileContext, scope: ast.AST, counter: str, first: ast.AST,
                        later: ast.AST) -> int:
    """What ``counter += n`` statements of ``scope``'s own code, lying after ``first`` and
    before ``later`` in the source and in no loop of their own, add to it."""
    lo, hi = getattr(first, "lineno", 0), getattr(later, "lineno", 0)
    total = 0
    for n in ctx.local_nodes(scope):
        if isinstance(n, ast.AugAssign) and dotted(n.target) == counter and lo < n.lineno < hi \
                and isinstance(n.value, ast.Constant) and type(n.value.value) is int \
                and ctx.enclosing(n, LOOPS) is ctx.enclosing(later, LOOPS):
            total += n.value.value if isinstance(n.op, ast.Add) else \
                -n.value.value if isinstance(n.op, ast.Sub) else 0
    return total


def shown(ctx: FileContext, scope: ast.AST, test: ast.AST) -> str:
    """``test`` as written, and what it reads as (a flag's value, a predicate's test)."""
    text = ast.unparse(test)
    value = through_name(ctx, scope, test)
    value = call_test(ctx, value) or value
    return text if value is test else f"{text}` = `{ast.unparse(value)}"


def never_true(ctx: FileContext, value: ast.AST) -> bool:
    """``value`` (or the one value its name is assigned) is ``c == n`` or ``c >= n`` with ``c``
    the variable of an enclosing ``for c in range(n)``: a test no iteration passes."""
    scope = ctx.enclosing(value, FUNCS) or ctx.tree
    test = through_name(ctx, scope, value)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq | ast.GtE) and isinstance(test.left, ast.Name)):
        return False
    counter, bound = test.left.id, ast.dump(test.comparators[0])
    cur = ctx.parents.get(test)
    while cur is not None and not isinstance(cur, SCOPES):
        if isinstance(cur, ast.For | ast.AsyncFor) and isinstance(cur.target, ast.Name) \
                and cur.target.id == counter:
            it = cur.iter
            return (isinstance(it, ast.Call) and dotted(it.func) == "range" and len(it.args) == 1
                    and ast.dump(it.args[0]) == bound and counter not in ctx.assigned_in(scope))
        cur = ctx.parents.get(cur)
    return False
