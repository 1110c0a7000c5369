"""Reading a learning-rate scheduler's horizon in a script: the constructor argument that
sizes it (``T_max``, ``total_steps``, ``num_training_steps``, a ``LambdaLR`` function's outside
count, a helper's parameter), what it is made of (names followed to their values, helpers'
returns inlined), and whether it counts batches (``len()``), divides, or scales by the number
of processes. The facts the schedule rules of :mod:`.horizon` (AG124, AG125) judge."""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator

from accumguard.static.lint._ast import WORLD_RE, call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument

__all__ = ["HORIZON_ARG", "calls_by_attr", "constructor_name", "divides", "expand", "helper_horizon", "iterated",
           "horizon_expr", "inlined_call", "is_world", "lambda_body", "lambda_horizon", "len_args",
           "multiplies_by_world", "outside_len", "schedulers", "window_of"]

#: scheduler constructors -> (keyword of the horizon, its position in the call)
HORIZON_ARG: dict[str, tuple[str, int]] = {
    "CosineAnnealingLR": ("T_max", 1),
    "LinearLR": ("total_iters", 4),
    "PolynomialLR": ("total_iters", 1),
    "ConstantLR": ("total_iters", 2),
    "OneCycleLR": ("total_steps", 2),
    "get_linear_schedule_with_warmup": ("num_training_steps", 2),
    "get_cosine_schedule_with_warmup": ("num_training_steps", 2),
    "get_polynomial_decay_schedule_with_warmup": ("num_training_steps", 2),
    "get_cosine_with_hard_restarts_schedule_with_warmup": ("num_training_steps", 2),
    "get_wsd_schedule": ("num_training_steps", 2),
    "get_scheduler": ("num_training_steps", 3),
}


def constructor_name(call: ast.Call) -> str | None:
    name = dotted(call.func)
    return name.rsplit(".", 1)[-1] if name else None


def horizon_expr(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """The horizon argument of a scheduler constructor call, or None. ``OneCycleLR`` without
    ``total_steps`` reads ``steps_per_epoch`` (its horizon is ``epochs * steps_per_epoch``:
    a per-epoch count in micro-batches is off by the same K); ``LambdaLR`` reads the name its
    lambda (or the function of the file it names) takes from outside, when that name is
    computed from a ``len()`` (``lambda s: 0.5 * (1 + cos(pi * s / total_steps))``)."""
    name = constructor_name(call)
    if name == "LambdaLR":
        return lambda_horizon(ctx, call)
    if name not in HORIZON_ARG:
        return None
    kw, pos = HORIZON_ARG[name]
    for k in call.keywords:
        if k.arg == kw:
            return k.value
    if name == "OneCycleLR":
        per_epoch = next((k.value for k in call.keywords if k.arg == "steps_per_epoch"), None)
        return per_epoch if per_epoch is not None or len(call.args) < 5 else call.args[4]
    if len(call.args) > pos:
        return call.args[pos]
    return None


def lambda_body(ctx: FileContext, call: ast.Call) -> ast.Lambda | ast.FunctionDef | None:
    """The factor function of a ``LambdaLR(opt, fn)`` call: the lambda, or the one ``def``
    of the file it names."""
    fn = next((k.value for k in call.keywords if k.arg == "lr_lambda"),
              call.args[1] if len(call.args) > 1 else None)
    if isinstance(fn, ast.Lambda):
        return fn
    if isinstance(fn, ast.Name):
        defs = ctx.defs_by_name().get(fn.id, [])
        if len(defs) == 1 and isinstance(defs[0], ast.FunctionDef):
            return defs[0]
    made = _factory_made(ctx, fn)
    return made[0] if made is not None else None


def _factory_made(ctx: FileContext, fn: ast.AST | None
                  ) -> tuple[ast.Lambda | ast.FunctionDef, dict[str, ast.AST]] | None:
    """For ``LambdaLR(opt, warmup_cosine(total, warm))``: the function the factory (a
    ``def`` of the file, defined once) returns, a nested ``def`` or a lambda, and the
    factory's parameters bound to the call's arguments."""
    if not (isinstance(fn, ast.Call) and isinstance(fn.func, ast.Name)):
        return None
    defs = ctx.defs_by_name().get(fn.func.id, [])
    if len(defs) != 1 or not isinstance(defs[0], ast.FunctionDef):
        return None
    factory = defs[0]
    rets = [r.value for r in walk_all(factory) if isinstance(r, ast.Return)
            and ctx.enclosing(r, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) is factory]
    if len(rets) != 1:
        return None
    made: ast.Lambda | ast.FunctionDef | None = rets[0] if isinstance(rets[0], ast.Lambda) else None
    if isinstance(rets[0], ast.Name):
        inner = [d for d in factory.body if isinstance(d, ast.FunctionDef) and d.name == rets[0].id]
        made = inner[0] if len(inner) == 1 else None
    if made is None:
        return None
    params = [a.arg for a in factory.args.posonlyargs + factory.args.args]
    bound: dict[str, ast.AST] = dict(zip(params, fn.args, strict=False))
    bound.update({k.arg: k.value for k in fn.keywords if k.arg})
    return made, bound


def lambda_horizon(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """The outside name a ``LambdaLR`` factor function reads that is a count of batches (for
    a function a factory returns, the factory's argument it reads)."""
    body = lambda_body(ctx, call)
    if body is None:
        return None
    fn = next((k.value for k in call.keywords if k.arg == "lr_lambda"),
              call.args[1] if len(call.args) > 1 else None)
    made = _factory_made(ctx, fn)
    if made is not None:
        args = [made[1][n.id] for n in walk_all(body) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load) and n.id in made[1]]
        # (the horizon itself before a count derived from it: `warm = total // 10`)
        args.sort(key=lambda a: any(isinstance(x, ast.BinOp | ast.Call) for x in walk_all(a)))
        return next((a for a in args if len_args(expand(ctx, a, 3))), None)
    a = body.args
    own = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    own |= {n.id for n in walk_all(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    free = [n for n in walk_all(body) if isinstance(n, ast.Name | ast.Attribute)
            and isinstance(n.ctx, ast.Load) and (d := dotted(n)) is not None
            and d.split(".", 1)[0] not in own]
    for depth in (1, 2, 3):  # the name nearest to its len(): `total_steps`, not `warmup` from it
        hit = next((n for n in free if len_args(expand(ctx, n, depth))), None)
        if hit is not None:
            return hit
    return None


def expand(ctx: FileContext, expr: ast.AST, depth: int = 3) -> list[ast.AST]:
    """``expr`` and, for each name in it assigned exactly once in the file, that value
    (recursively, ``depth`` levels): the parts the horizon is computed from."""
    parts = [expr]
    if depth == 0:
        return parts
    index = ctx.values_by_name()
    entries: dict[int, ast.AST] = {}  # `CFG["epochs"]` of a dict literal: that entry, not the dict
    for n in outside_len(expr):
        if (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)
                and len(values := index.get(dotted(n.value) or "", [])) == 1
                and isinstance(values[0], ast.Dict)):
            entry = next((v for k, v in zip(values[0].keys, values[0].values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == n.slice.value), None)
            if entry is not None:
                entries[id(n.value)] = entry
    names = {d for n in outside_len(expr) if isinstance(n, ast.Name | ast.Attribute)
             and id(n) not in entries and (d := dotted(n))}
    for value in entries.values():
        parts += expand(ctx, value, depth - 1)
    for name in names:
        values = index.get(name, [])
        if len(values) == 1:
            parts += expand(ctx, values[0], depth - 1)
            inlined = inlined_call(ctx, values[0])
            if inlined is not None:
                parts += expand(ctx, inlined, depth - 1)
    return parts


def inlined_call(ctx: FileContext, value: ast.AST) -> ast.AST | None:
    """``num_update_steps(cfg, len(loader))`` for a function of the file whose body is one
    ``return`` of an expression of its parameters: that expression, each parameter replaced
    by the call's argument (the call site's own nodes, so a ``len(loader)`` keeps its line);
    else None."""
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name) or value.keywords \
            or any(isinstance(a, ast.Starred) for a in value.args):
        return None
    defs = ctx.functions_by_name().get(value.func.id, [])
    if len(defs) != 1:
        return None
    fn = defs[0]
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    params = [a.arg for a in fn.args.args]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None \
            or len(params) != len(value.args):
        return None
    args = dict(zip(params, value.args, strict=True))

    class _Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 (ast's visitor name)
            return args.get(node.id, node)

    return _Bind().visit(copy.deepcopy(body[0].value))  # type: ignore[no-any-return]


def outside_len(expr: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``expr`` that are not inside a ``len(...)``: the horizon's arithmetic.
    The loader whose length is taken is not expanded (``DataLoader(ds,
    batch_size=cfg["micro_batch_size"])`` says nothing about how the count is scaled)."""
    todo = [expr]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            continue
        todo.extend(ast.iter_child_nodes(node))


def calls_by_attr(ctx: FileContext) -> dict[str, list[ast.Call]]:
    """``x.step()``, ``x.prepare(...)``... by method name, one pass over the file (cached)."""
    def compute() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for c in ctx.of(ast.Call):
            name = call_attr(c)
            if name is not None:
                out.setdefault(name, []).append(c)
        return out
    return ctx._cached("horizon_calls", ctx.tree, compute)  # type: ignore[no-any-return]


def window_of(ctx: FileContext, node: ast.AST) -> ast.AST | None:
    """The window ``node`` is in: the nearest enclosing window, within its own scope."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef
                                                  | ast.ClassDef | ast.Lambda):
        if ctx.is_window(cur):
            return cur
        cur = ctx.parents.get(cur)
    return cur if cur is not None and ctx.is_window(cur) else None


def len_args(parts: list[ast.AST]) -> set[str]:
    """The names whose ``len()`` the horizon reads (``len(loader)``, ``len(train_dl)``)."""
    out: set[str] = set()
    for p in parts:
        for n in walk_all(p):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
                    and len(n.args) == 1 and (d := dotted(n.args[0]))):
                out.add(d)
    return out


def divides(parts: list[ast.AST]) -> list[ast.AST]:
    """The denominators of every division in the horizon's parts (``/``, ``//``,
    ``math.ceil(a / b)``)."""
    return [n.right for p in parts for n in outside_len(p)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv)]


def is_world(expr: ast.AST) -> bool:
    """``expr`` itself names the world size (``accelerator.num_processes``, ``world_size``,
    ``dist.get_world_size()``), not a value derived from it."""
    if isinstance(expr, ast.Call) and not expr.args:
        expr = expr.func
    d = dotted(expr)
    return d is not None and WORLD_RE.search(d.rsplit(".", 1)[-1].lower()) is not None


def multiplies_by_world(parts: list[ast.AST], ctx: FileContext | None = None) -> bool:
    """A ``* num_processes`` in the horizon: it is already counted in scheduler steps. With
    ``ctx``, also a local name assigned from the number of processes (``ticks =
    accelerator.num_processes``)."""
    def world(x: ast.AST) -> bool:
        if is_world(x):
            return True
        if ctx is None or not isinstance(x, ast.Name):
            return False
        if ctx.mentions_world(x):
            return True
        # a parameter the calls of its function give the number of processes (`make_sched(opt,
        # args, n_proc)` called with `W = accelerator.num_processes`; a single-process
        # reference's call may pass 1)
        fn = ctx.enclosing(x, (ast.FunctionDef, ast.AsyncFunctionDef))
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or x.id not in {
                a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}:
            return False
        args = [bound_argument(fn, c, x.id) for c in ctx.of(ast.Call)
                if isinstance(c.func, ast.Name) and c.func.id == fn.name]
        worlds = [a for a in args if a is not None and (is_world(a) or ctx.mentions_world(a))]
        return bool(worlds) and all(
            a in worlds or (isinstance(a, ast.Constant) and a.value == 1) for a in args)
    for p in parts:
        # (a product below a division's line, `len(dl) // (num_processes * K)`, divides)
        below = {id(x) for n in walk_all(p) if isinstance(n, ast.BinOp)
                 and isinstance(n.op, ast.Div | ast.FloorDiv) for x in walk_all(n.right)}
        for n in walk_all(p):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and id(n) not in below and (
                    world(n.left) or world(n.right)):
                return True
    return False


def schedulers(ctx: FileContext) -> Iterator[tuple[str, ast.Call, ast.AST]]:
    """(assigned name, constructor call, horizon) of every scheduler built with a readable
    horizon and assigned to one name."""
    for node in ctx.of(ast.Assign):
        if not isinstance(node.value, ast.Call) or len(node.targets) != 1:
            continue
        name = dotted(node.targets[0])
        horizon = horizon_expr(ctx, node.value) or helper_horizon(ctx, node.value)
        if name is None or horizon is None:
            continue
        yield name, node.value, horizon


_HORIZON_NAME = re.compile(r"total|max|horizon|num_training|num_steps|t_max|decay", re.IGNORECASE)


def helper_horizon(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """The argument a call of a function of the file passes for the horizon of the scheduler
    it returns (``def linear_schedule(opt, num_training_steps): return LambdaLR(opt, lambda
    s: 1 - s / num_training_steps)``, called ``linear_schedule(opt, epochs * len(loader))``)."""
    if not isinstance(call.func, ast.Name):
        return None
    defs = ctx.defs_by_name().get(call.func.id, [])
    if len(defs) != 1:
        return None
    rets = [n for n in walk_all(defs[0]) if isinstance(n, ast.Return)
            and ctx.enclosing(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) is defs[0]]
    if len(rets) != 1 or not isinstance(rets[0].value, ast.Call):
        return None
    ctor = rets[0].value
    params = [a.arg for a in defs[0].args.posonlyargs + defs[0].args.args]
    if constructor_name(ctor) == "LambdaLR":
        fn: ast.AST | None = next((k.value for k in ctor.keywords if k.arg == "lr_lambda"),
                                  ctor.args[1] if len(ctor.args) > 1 else None)
        if isinstance(fn, ast.Name):  # `def f(step): ...` inside the helper, `LambdaLR(opt, f)`
            fn = next((d for d in walk_all(defs[0]) if isinstance(d, ast.FunctionDef)
                       and d.name == fn.id and d is not defs[0]), None)
        reads = {n.id for n in walk_all(fn) if isinstance(n, ast.Name)} \
            if isinstance(fn, ast.Lambda | ast.FunctionDef) else set()
        read = [p for p in params if p in reads and "warm" not in p.lower()]
        # the horizon among the parameters the schedule reads: one named so, else the last
        # (a warm-up length is read too, and is not the horizon)
        named = [p for p in read if _HORIZON_NAME.search(p)]
        inner: ast.AST | None = ast.Name(id=(named or read)[-1]) if read else None
    else:
        inner = horizon_expr(ctx, ctor) if constructor_name(ctor) in HORIZON_ARG else None
    if not isinstance(inner, ast.Name) or inner.id not in params:
        return None
    idx = params.index(inner.id)
    kw = next((k.value for k in call.keywords if k.arg == inner.id), None)
    return kw if kw is not None else (call.args[idx] if idx < len(call.args) else None)


def iterated(loop: ast.AST) -> str | None:
    """The name a ``for`` loop iterates (``loader`` of ``for i, b in enumerate(loader)``,
    ``enumerate(tqdm(loader))`` too); None for another node."""
    if not isinstance(loop, ast.For | ast.AsyncFor):
        return None
    it = loop.iter
    while isinstance(it, ast.Call) and (dotted(it.func) or "").rsplit(".", 1)[-1] in (
            "enumerate", "tqdm", "iter") and it.args:
        it = it.args[0]
    return dotted(it)
