"""The step's modulo guard and the micro-batch counter it tests, read from the AST.

What AG115 and AG117 of the window family (:mod:`.window`) reason about: a guard
``if (c + offset) % K == 0`` (:func:`mod_guard`), where the counter ``c`` starts on the
first micro-batch (:func:`counter_start`), and where a statement sits in the window.
The rules stay in the family module; this module emits no finding.
"""

from __future__ import annotations

import ast
import copy
from bisect import bisect_left
from dataclasses import dataclass, replace

from accumguard.static.lint._ast import FUNCS, LOOPS, call_attr, dotted, position, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._lengths import generator_loop


@dataclass(frozen=True)
class ModGuard:
    """``if (c + offset) % K == 0`` (optionally ``and c > 0``): fires when c + offset is a
    multiple of K."""

    counter: str
    offset: int
    excludes_zero: bool
    modulus: ast.AST
    # r of ``c % K == r`` (r >= 1, folded into ``offset`` as -r): which window it gives depends
    # on K's value, so the rule reads K's values instead of reasoning with a symbolic K
    residue: int = 0


def _counter_and_offset(expr: ast.AST) -> tuple[str, int] | None:
    """``i`` -> (i, 0); ``i + 1`` / ``1 + i`` -> (i, 1); ``i - 1`` -> (i, -1)."""
    if isinstance(expr, ast.Name | ast.Attribute):
        d = dotted(expr)
        return (d, 0) if d else None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add | ast.Sub):
        left, right = expr.left, expr.right
        if isinstance(expr.op, ast.Add) and isinstance(left, ast.Constant):
            left, right = right, left
        if isinstance(right, ast.Constant) and type(right.value) is int and isinstance(left, ast.Name | ast.Attribute):
            d = dotted(left)
            if d:
                return d, right.value if isinstance(expr.op, ast.Add) else -right.value
    return None


def mod_term(term: ast.AST) -> ModGuard | None:
    """``(c + a) % K == 0``, ``c % K == K - 1``, ``0 == c % K``, ``not c % K``."""
    mod: ast.AST | None = None
    shift = 0
    residue = 0
    if isinstance(term, ast.UnaryOp) and isinstance(term.op, ast.Not):
        mod = term.operand
    elif isinstance(term, ast.Compare) and len(term.ops) == 1 and isinstance(term.ops[0], ast.Eq):
        a, b = term.left, term.comparators[0]
        if not (isinstance(a, ast.BinOp) and isinstance(a.op, ast.Mod)):
            a, b = b, a
        if not (isinstance(a, ast.BinOp) and isinstance(a.op, ast.Mod)):
            return None
        mod = a
        if isinstance(b, ast.Constant) and b.value == 0 and type(b.value) is int:
            shift = 0
        elif isinstance(b, ast.Constant) and type(b.value) is int and 0 < b.value < 64:
            residue = b.value  # c % K == r  <=>  (c - r) % K == 0, for K > r
        elif (
            isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)
            and isinstance(b.right, ast.Constant) and b.right.value == 1
            and ast.dump(b.left) == ast.dump(a.right)
        ):
            shift = 1  # c % K == K - 1  <=>  (c + 1) % K == 0
        else:
            return None
    if not (isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod)):
        return None
    if isinstance(mod.right, ast.Constant):
        k = mod.right.value
        if type(k) is not int or k < 4 or k <= residue:
            return None  # the symbolic reasoning below assumes K larger than the offsets
    co = _counter_and_offset(mod.left)
    if co is None:
        return None
    return ModGuard(co[0], co[1] + shift - residue, False, mod.right, residue)


def _excludes_zero(term: ast.AST, counter: str) -> bool:
    """``c > 0``, ``c >= 1``, ``c != 0``, ``0 < c``, ``c`` (truthy)."""
    if isinstance(term, ast.Name | ast.Attribute):
        return dotted(term) == counter
    if isinstance(term, ast.Compare) and len(term.ops) == 1:
        left, op, right = term.left, term.ops[0], term.comparators[0]
        if isinstance(left, ast.Constant):
            left, right = right, left
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(type(op), op)
        if dotted(left) != counter or not isinstance(right, ast.Constant):
            return False
        v = right.value
        return (isinstance(op, ast.Gt | ast.NotEq) and v == 0) or (isinstance(op, ast.GtE) and v == 1)
    return False


def _end_of_data(term: ast.AST) -> bool:
    """``i + 1 == len(loader)``, ``is_last_batch``: the final flush, not the window size."""
    for sub in walk_all(term):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "len":
            return True
        if isinstance(sub, ast.Name | ast.Attribute):
            ident = (sub.id if isinstance(sub, ast.Name) else sub.attr).lower()
            if any(w in ident for w in ("last", "final", "end", "total", "max_steps", "num_steps")):
                return True
    return False


def mod_guard(test: ast.AST) -> ModGuard | None:
    """The modulo guard of an ``if`` test, when its first firing can be computed."""
    if isinstance(test, ast.BoolOp):
        mods = [(t, g) for t in test.values if (g := mod_term(t)) is not None]
        if len(mods) != 1:
            return None
        term, guard = mods[0]
        others = [t for t in test.values if t is not term]
        if isinstance(test.op, ast.And):
            if not all(_excludes_zero(t, guard.counter) for t in others):
                return None  # another condition: when it holds cannot be told
            return replace(guard, excludes_zero=bool(others))
        if all(_end_of_data(t) for t in others):
            return guard  # `... or i + 1 == len(loader)`: the end of the data, not the window
        return None
    return mod_term(test)


def call_test(ctx: FileContext, test: ast.AST) -> ast.AST | None:
    """``if is_boundary(i):`` with ``def is_boundary(step): return (step + 1) % K == 0`` (one
    definition of the name in the file, a body of one ``return``, positional parameters only):
    the returned test with each parameter replaced by the call's argument; None otherwise."""
    if not isinstance(test, ast.Call) or test.keywords:
        return None
    func = test.func
    method = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id == "self"  # `self._is_boundary(i, n)`: a method of the class
    if not (isinstance(func, ast.Name) or method):
        return None
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    defs = ctx.defs_by_name().get(name, [])
    if len(defs) != 1:
        return None
    fn = defs[0]
    body = [b for b in fn.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    args = fn.args
    params = [a.arg for a in args.posonlyargs + args.args]
    if method:
        if not params or params[0] != "self" or any(
                isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
                for d in fn.decorator_list):
            return None
        params = params[1:]
    if (len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None
            or args.vararg or args.kwarg or args.kwonlyargs or len(test.args) != len(params)
            or any(isinstance(a, ast.Starred) for a in test.args)):
        return None
    bound = dict(zip(params, test.args, strict=True))

    class _Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return copy.deepcopy(bound[node.id]) if node.id in bound else node

    result: ast.AST = _Bind().visit(copy.deepcopy(body[0].value))
    return ast.fix_missing_locations(result)


def flag_guard(ctx: FileContext, test: ast.AST, window: ast.AST) -> tuple[ModGuard, ast.Assign] | None:
    """``flag = step % K == 0`` once in every iteration of ``window``, then ``if flag:``
    (or ``flag = step % K != 0`` then ``if not flag:``; the flag often also picks ``no_sync``): the guard of the assignment, and the assignment
    (the counter is read where it is, not at the ``if``). None for any other test, a flag
    written twice or under a branch, an assignment after the test, or a test in a nested
    function."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    if negated:
        test = test.operand  # type: ignore[attr-defined]
    if not isinstance(test, ast.Name):
        return None
    writes = _assigned_in(ctx, window, test.id)
    if len(writes) != 1:
        return None
    flag = writes[0]
    if not (isinstance(flag, ast.Assign) and len(flag.targets) == 1 and position(flag) < position(test)
            and _every_iteration(ctx, flag, window)
            and ctx.enclosing(flag, FUNCS) is ctx.enclosing(test, FUNCS)):
        return None  # (an `if flag:` in a closure defined in the loop runs who knows when)
    value = flag.value
    if negated:  # `if not accumulating:` with `accumulating = i % K != 0`
        if not (isinstance(value, ast.Compare) and len(value.ops) == 1
                and isinstance(value.ops[0], ast.NotEq)):
            return None
        value = ast.Compare(left=value.left, ops=[ast.Eq()], comparators=value.comparators)
    guard = mod_guard(value)
    return None if guard is None else (guard, flag)


def int_constant(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_constant(node.operand)
        return None if inner is None else -inner
    return None


def _assigned_in(ctx: FileContext, window: ast.AST, counter: str) -> list[ast.AST]:
    """Statements of ``window`` (nested loops included) that write ``counter``."""
    out: list[ast.AST] = []
    for n in ctx.local_nodes(window):
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(dotted(t) == counter for t in targets):
                out.append(n)
    return out


UNKNOWN_START = object()


def counter_start(ctx: FileContext, window: ast.AST, top: ast.stmt, counter: str) -> object:
    """The counter's value at the test for the first micro-batch (0 for ``enumerate``), or
    ``UNKNOWN_START`` for a per-micro-batch counter that starts at a value not in sight, or
    None when ``counter`` is not a per-micro-batch counter of this loop."""
    if isinstance(window, ast.For | ast.AsyncFor):
        it, target = window.iter, window.target
        idx: str | None = None
        start: object = None
        if (
            isinstance(target, ast.Tuple) and target.elts and isinstance(it, ast.Call)
            and dotted(it.func) == "enumerate"
        ):
            idx = dotted(target.elts[0])
            arg = enumerate_start(it)
            start = 0 if arg is None else int_constant(arg)
        elif isinstance(target, ast.Tuple) and target.elts and (gen := generator_loop(ctx, it)) is not None:
            # `for i, x, y in batches(loader)` of a generator yielding enumerate's index first
            loop, value = gen
            inner = loop.iter
            if (isinstance(inner, ast.Call) and dotted(inner.func) == "enumerate"
                    and isinstance(loop.target, ast.Tuple) and loop.target.elts
                    and isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts)
                    and dotted(value.elts[0]) is not None
                    and dotted(value.elts[0]) == dotted(loop.target.elts[0])
                    and not _assigned_in(ctx, loop, dotted(value.elts[0]) or "")):
                idx = dotted(target.elts[0])
                arg = enumerate_start(inner)
                start = 0 if arg is None else int_constant(arg)
        elif isinstance(target, ast.Name) and isinstance(it, ast.Call) and dotted(it.func) == "range" and it.args:
            idx = target.id
            if len(it.args) == 3 and int_constant(it.args[2]) != 1:
                return None
            start = 0 if len(it.args) == 1 else int_constant(it.args[0])
        if idx == counter:
            if _assigned_in(ctx, window, counter):
                return None  # the loop variable is rewritten in the body
            return UNKNOWN_START if start is None else start
    body = getattr(window, "body", None)
    if not isinstance(body, list):
        return None
    writes = _assigned_in(ctx, window, counter)
    if len(writes) != 1:
        return None  # reset in the loop, or counted in several places: not a plain counter
    inc = writes[0]
    if not (
        isinstance(inc, ast.AugAssign) and isinstance(inc.op, ast.Add)
        and int_constant(inc.value) == 1 and _every_iteration(ctx, inc, window)
    ):
        return None
    bump = 1 if position(inc) < position(top) else 0
    init = _initial_value(ctx, window, counter)
    if init is None and bump:
        # counted before the test: from 0 it reads 1 at the first micro-batch, so windows
        # are K whatever the start (a counter restored on resume); nothing to say
        return None
    return UNKNOWN_START if init is None else init + bump


def _every_iteration(ctx: FileContext, node: ast.AST, window: ast.AST) -> bool:
    """``node`` runs once in every iteration of ``window``: a statement of its body, or
    inside ``with`` blocks (or a ``try`` body) there, never under an ``if`` or a loop."""
    cur = ctx.parents.get(node)
    child = node
    while cur is not None and cur is not window:
        if isinstance(cur, ast.Try):
            if child not in cur.body and child not in cur.finalbody:
                return False
        elif not isinstance(cur, ast.With | ast.AsyncWith):
            return False
        child, cur = cur, ctx.parents.get(cur)
    return cur is window and child in getattr(window, "body", [])


def assignments_by_name(ctx: FileContext, scope: ast.AST) -> dict[str, list[ast.AST]]:
    """``name = value`` statements of ``scope`` by target, in source order (cached per scope,
    so a file of many loops is indexed once)."""
    def compute() -> dict[str, list[ast.AST]]:
        out: dict[str, list[ast.AST]] = {}
        for n in ctx.local_nodes(scope):
            if isinstance(n, ast.Assign | ast.AnnAssign):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    if (d := dotted(t)) is not None:
                        out.setdefault(d, []).append(n)
        for lst in out.values():
            lst.sort(key=position)
        return out
    return ctx._cached("assign_index", scope, compute)  # type: ignore[no-any-return]


def _initial_value(ctx: FileContext, window: ast.AST, counter: str) -> int | None:
    """The last ``counter = <int>`` before ``window`` in its function (for ``self.x``, else in
    the class's ``__init__``)."""
    writes = assignments_by_name(ctx, ctx.scope_of(window)).get(counter, [])
    before = bisect_left(writes, position(window), key=position)  # sorted by position
    last: ast.AST | None = writes[before - 1] if before else None
    if last is None and counter.startswith("self."):
        cls = ctx.enclosing(window, (ast.ClassDef,))
        init = next((f for f in getattr(cls, "body", []) if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is not None:
            in_init = assignments_by_name(ctx, init).get(counter, [])
            last = in_init[-1] if in_init else None
    return int_constant(getattr(last, "value", None))


def top_statement(ctx: FileContext, node: ast.AST, window: ast.AST) -> ast.stmt | None:
    """The statement of ``window``'s body that contains ``node`` (None across a nested loop)."""
    cur, parent = node, ctx.parents.get(node)
    while parent is not None and parent is not window:
        if isinstance(parent, LOOPS):
            return None
        cur, parent = parent, ctx.parents.get(parent)
    return cur if parent is window and isinstance(cur, ast.stmt) and cur in getattr(window, "body", []) else None


def exclusive(ctx: FileContext, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of the same ``if``."""
    chain: dict[int, ast.AST] = {}
    child, cur = a, ctx.parents.get(a)
    while cur is not None:
        chain[id(cur)] = child
        child, cur = cur, ctx.parents.get(cur)
    child, cur = b, ctx.parents.get(b)
    while cur is not None:
        if id(cur) in chain:
            if isinstance(cur, ast.If):
                ca = chain[id(cur)]
                return (ca in cur.body) != (child in cur.body)
            return False
        child, cur = cur, ctx.parents.get(cur)
    return False


def window_size_text(m: int, o: int) -> str:
    if m == 0:
        return str(o)
    return "K" + (f" + {o}" if o > 0 else f" - {-o}" if o < 0 else "")


def first_window(start: int, offset: int, k: int, after: bool, excludes_zero: bool) -> int:
    """Micro-batches in the first window for a concrete K: the first j >= 0 with
    ``(start + j + offset) % k == 0`` (and a nonzero counter with ``excludes_zero``), plus
    one when the step follows the backward; 0 is a no-op step before any backward."""
    j = next(
        j for j in range(2 * k + abs(offset) + abs(start) + 1)
        if (start + j + offset) % k == 0 and not (excludes_zero and start + j == 0)
    )
    return j + (1 if after else 0)


def k_values(ctx: FileContext, modulus: ast.AST, site: ast.AST) -> set[int | None]:
    """Every integer the file gives the modulus ``K`` (None for a value not in sight): the
    values :meth:`int_candidates` reads, and for a parameter of the function around ``site``
    the values its calls pass (:func:`param_arguments`: its default when a call passes
    nothing; None for a call the file does not show)."""
    values = set(ctx.int_candidates(modulus))
    func = ctx.enclosing(site, FUNCS)
    name = modulus.id if isinstance(modulus, ast.Name) else None
    if name is None or not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
        return values
    passed = param_arguments(ctx, func, name)
    if passed is _NOT_A_PARAM:
        return values
    values.discard(None)
    found: set[int | None] = set()
    for arg in passed or [None]:
        found |= {None} if arg is None else ctx.int_candidates(arg)
    return (values | found) or {None}


#: :func:`param_arguments` for a name that is not a parameter of the function
_NOT_A_PARAM: list[ast.AST | None] = []


def param_arguments(
    ctx: FileContext, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> list[ast.AST | None]:
    """The expressions the file's calls of ``func`` pass for its parameter ``name`` (the
    parameter's default for a call that passes nothing), with None for a value not in
    sight: a ``*args`` / ``**kwargs`` call, the function handed over as a value
    (``fire.Fire(main)``, ``mp.spawn(train, ...)``), a decorator (``@click.command``), the
    parameter rebound in the body, or no default and no call. :data:`_NOT_A_PARAM` (an empty
    list) when ``name`` is no parameter of ``func``."""
    args = func.args
    positional = args.posonlyargs + args.args
    params = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True)}
    params |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    if name not in params and name not in {a.arg for a in positional + args.kwonlyargs}:
        return _NOT_A_PARAM
    out: list[ast.AST | None] = []
    if _rebound(ctx, func, name) or _called_from_outside(ctx, func):
        out.append(None)
    index = next((i for i, a in enumerate(positional) if a.arg == name), None)
    method = bool(positional) and positional[0].arg in ("self", "cls")
    calls = calls_by_name(ctx).get(func.name, [])
    default_used = not calls
    for call in calls:
        if dotted(call.func) not in (func.name, f"self.{func.name}", f"cls.{func.name}") and not (
            method and isinstance(call.func, ast.Attribute)
        ):
            continue
        kw = next((k.value for k in call.keywords if k.arg == name), None)
        bound = isinstance(call.func, ast.Attribute) and method
        at = None if index is None else index - 1 if bound else index
        if kw is None and at is not None and 0 <= at < len(call.args):
            kw = call.args[at]
            if any(isinstance(a, ast.Starred) for a in call.args[: at + 1]):
                kw = None
                out.append(None)  # f(*xs, k): which argument lands on K is not in sight
                continue
        starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
        if kw is not None:
            out.append(kw)
        elif starred:
            out.append(None)  # f(*args) / f(**cfg): what the parameter gets is not in sight
        else:
            default_used = True
    if default_used:
        out.append(params.get(name))
    return out


def _rebound(ctx: FileContext, func: ast.AST, name: str) -> bool:
    """The parameter ``name`` is assigned again in the body of ``func``."""
    for n in ctx.local_nodes(func):
        if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(s, ast.Name) and s.id == name for t in targets for s in walk_all(t)):
                return True
    return False


def _called_from_outside(ctx: FileContext, func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``func`` may be called with arguments the file does not show: a decorator other than
    ``staticmethod``/``classmethod`` (``@click.option``, ``@hydra.main``), or its name used as
    a value rather than called (``fire.Fire(main)``, ``mp.spawn(train, ...)``,
    ``Thread(target=self.run)``)."""
    if any((dotted(d.func if isinstance(d, ast.Call) else d) or "") not in ("staticmethod", "classmethod")
           for d in func.decorator_list):
        return True
    return func.name in _names_passed_as_values(ctx)


def _names_passed_as_values(ctx: FileContext) -> set[str]:
    """Names (the last part) handed to a call as an argument, once per file."""
    def compute() -> set[str]:
        out: set[str] = set()
        for n in ctx.of(ast.Call):
            for a in [*n.args, *(k.value for k in n.keywords)]:
                if isinstance(a, ast.Name):
                    out.add(a.id)
                elif isinstance(a, ast.Attribute):
                    out.add(a.attr)
        return out
    return ctx._cached("names_passed", ctx.tree, compute)  # type: ignore[no-any-return]




def calls_by_name(ctx: FileContext) -> dict[str, list[ast.Call]]:
    """The file's calls by function/method name (the last part: ``f``, ``self.f`` and
    ``obj.f`` all under ``f``), indexed once per file."""
    def compute() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for call in ctx.of(ast.Call):
            name = call_attr(call)
            if name is not None:
                out.setdefault(name, []).append(call)
        return out
    return ctx._cached("calls_by_name", ctx.tree, compute)  # type: ignore[no-any-return]


def enumerate_start(it: ast.Call) -> ast.AST | None:
    """The ``start`` of ``enumerate(xs, start)`` / ``enumerate(xs, start=s)``, else None."""
    return it.args[1] if len(it.args) > 1 else next((k.value for k in it.keywords if k.arg == "start"), None)


def start_residues(ctx: FileContext, window: ast.AST,
                    guard: ModGuard) -> list[tuple[ast.Call, ast.AST, int]] | None:
    """``for i, b in enumerate(loader, start=first)`` with ``first`` a parameter of the
    function holding the loop: per call of that function, (call, argument, its residue mod K:
    1 for ``1`` or ``x * K + 1``, 0 for ``0`` or ``x * K``); None when the start is not such
    a parameter or some argument's residue cannot be read."""
    it = window.iter if isinstance(window, ast.For) else None
    if not (isinstance(it, ast.Call) and dotted(it.func) == "enumerate"):
        return None
    first = enumerate_start(it)
    fn = ctx.enclosing(window, FUNCS)
    if not (isinstance(first, ast.Name) and isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)) \
            or first.id not in {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}:
        return None
    k_text = ast.unparse(guard.modulus)
    out = []
    for c in ctx.of(ast.Call):
        if call_attr(c) != fn.name:
            continue
        arg = bound_argument(fn, c, first.id)
        if arg is None:
            return None
        r = _residue(ctx, arg, k_text)
        if r is None:
            return None
        out.append((c, arg, r))
    return out or None


def _residue(ctx: FileContext, arg: ast.AST, k_text: str) -> int | None:
    """1 or 0: ``arg`` is 1 / 0, or ``x * K + 1`` / ``x * K`` with K spelled as the test's
    modulus (or named like an accumulation count); None otherwise."""
    def times_k(e: ast.AST) -> bool:
        return isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and any(
            ast.unparse(x) == k_text or ctx.mentions_accum(x) for x in (e.left, e.right))
    if isinstance(arg, ast.Constant) and arg.value in (0, 1) and type(arg.value) is int:
        return int(arg.value)
    if times_k(arg):
        return 0
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and times_k(arg.left) \
            and isinstance(arg.right, ast.Constant) and arg.right.value == 1:
        return 1
    return None
