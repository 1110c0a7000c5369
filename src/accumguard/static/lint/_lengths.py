"""How many items a loop over a data loader runs, when the script says so with constants.

The final partial window of an epoch (F7) leaks into the next epoch only when the number
of batches per epoch is not a multiple of K. That number is usually known at run time
only; but small scripts often spell it out: ``DataLoader(TensorDataset(torch.randn(50, 8),
...), batch_size=5)`` is 10 batches, ``data = [... for _ in range(10)]`` is 10 items.
:func:`static_len` follows names to their single assignment, and a call of a function of
the file (``loader = make_loader()``) to that function's single ``return``, and reads those
shapes (sizes may be module constants: ``N = 50``, ``BATCH = 5``), and a dataset class of
the file whose ``__len__`` returns the length of something its ``__init__`` builds from the
constructor's arguments (:func:`dataset_class_len`); any other shape (a sampler, a slice,
a value from the command line) is ``None``: unknown, never guessed.
"""

from __future__ import annotations

import ast
import copy
from typing import Any, Literal, Protocol

from accumguard.static.lint._ast import call_attr, dotted, last_part
from accumguard.static.lint._ctx_boundary import bound_argument

__all__ = ["dataset_class_len", "generator_loop", "returned_value", "static_len"]

#: tensor constructors whose first positional argument (or its first element) is the length
_SHAPED = frozenset({"randn", "rand", "zeros", "ones", "empty", "full", "randn_like"})
_MAX_DEPTH = 16


class _Facts(Protocol):
    tree: ast.Module
    parents: dict[ast.AST, ast.AST]

    def of(self, *types: type) -> list[Any]: ...

    def assignments(self) -> list[tuple[list[str], ast.AST]]: ...

    def _cached(self, kind: str, node: ast.AST, compute: Any) -> Any: ...

    def int_value(self, expr: ast.AST | None, *, defaults: bool = True) -> int | None: ...

    def functions_by_name(self) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]: ...


def static_len(ctx: _Facts, expr: ast.AST | None, depth: int = 0) -> int | None:
    """``len(expr)`` when the script makes it evident with constants, else None."""
    if expr is None or depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.Name) or (isinstance(expr, ast.Attribute) and dotted(expr) is not None):
        value = _single_assignment(ctx, dotted(expr) or "", expr)  # `loader`, `self.loader`
        return None if value is None else static_len(ctx, value, depth + 1)
    if isinstance(expr, ast.List | ast.Tuple):
        return None if any(isinstance(e, ast.Starred) for e in expr.elts) else len(expr.elts)
    if isinstance(expr, ast.ListComp | ast.GeneratorExp):
        gens = expr.generators
        if len(gens) == 1 and not gens[0].ifs and not gens[0].is_async:
            return static_len(ctx, gens[0].iter, depth + 1)
        return None
    if not isinstance(expr, ast.Call):
        return None
    name = call_attr(expr) or ""
    if name in ("enumerate", "tqdm", "list", "tuple") and expr.args:
        return static_len(ctx, expr.args[0], depth + 1)
    if name == "range":
        return _range_len(ctx, expr)
    if name == "DataLoader":
        return _loader_len(ctx, expr, depth)
    if name == "TensorDataset" and expr.args:
        return _tensor_len(ctx, expr.args[0], depth + 1)
    gen = generator_loop(ctx, expr)
    if gen is not None:
        return static_len(ctx, gen[0].iter, depth + 1)
    own = dataset_class_len(ctx, expr)
    if own is not None:
        kind, held = own
        if kind == "int":
            return _int_of(ctx, held)
        n = _tensor_len(ctx, held, depth + 1)
        return n if n is not None else static_len(ctx, held, depth + 1)
    returned = returned_value(ctx, expr)
    return None if returned is None else static_len(ctx, returned, depth + 1)


def generator_loop(ctx: _Facts, call: ast.AST) -> tuple[ast.For, ast.expr] | None:
    """For a call of a generator function of the file (one definition) that yields once per
    iteration of one loop (``for i, (x, y) in enumerate(loader): ... yield i, x, y``, no other
    ``yield``, nothing leaving the loop early): that loop and the yielded value; else None."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    defs = ctx.functions_by_name().get(call.func.id, [])
    if len(defs) != 1:
        return None
    own = _own_nodes(defs[0])
    if any(isinstance(n, ast.YieldFrom) for n in own):
        return None
    yields = [n for n in own if isinstance(n, ast.Yield)]
    if len(yields) != 1:
        return None
    stmt = ctx.parents.get(yields[0])
    loop = ctx.parents.get(stmt) if isinstance(stmt, ast.Expr) else None
    if not (isinstance(loop, ast.For) and stmt in loop.body and loop in own):
        return None
    if any(isinstance(n, ast.Break | ast.Continue | ast.Return) for n in _own_nodes(loop)):
        return None
    return loop, yields[0].value or ast.Constant(None)


def dataset_class_len(ctx: _Facts, call: ast.AST) -> tuple[Literal["rows", "int"], ast.AST] | None:
    """For ``Blobs(64, 8)`` of a class of the file whose ``__len__`` is ``len(self.y)``,
    ``self.x.shape[0]``, ``self.x.size(0)`` or ``self.n``: what its length is, with each
    ``self.attr`` replaced by the one value ``__init__`` assigns it and each of ``__init__``'s
    parameters by the argument this call gives it (or its default). ``("rows", e)``: the
    length is the number of rows of ``e``; ``("int", e)``: it is the integer ``e``. The
    arguments are the call's own nodes, so that names in them are read where the call is.
    None when any step is not in sight (several assignments, a parameter not passed)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    classes = [c for c in ctx.of(ast.ClassDef) if c.name == call.func.id]
    if len(classes) != 1:
        return None
    methods = {f.name: f for f in classes[0].body if isinstance(f, ast.FunctionDef)}
    init, length = methods.get("__init__"), methods.get("__len__")
    if init is None or length is None:
        return None
    returns = [n for n in _own_nodes(length) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    ret = returns[0].value
    kind: Literal["rows", "int"] = "int"
    if isinstance(ret, ast.Call) and call_attr(ret) == "len" and len(ret.args) == 1:
        kind, ret = "rows", ret.args[0]
    elif isinstance(ret, ast.Subscript) and isinstance(ret.value, ast.Attribute) \
            and ret.value.attr == "shape" and isinstance(ret.slice, ast.Constant) and ret.slice.value == 0:
        kind, ret = "rows", ret.value.value
    elif isinstance(ret, ast.Call) and isinstance(ret.func, ast.Attribute) and ret.func.attr == "size" \
            and len(ret.args) == 1 and isinstance(ret.args[0], ast.Constant) and ret.args[0].value == 0:
        kind, ret = "rows", ret.func.value
    held = _init_bound(ctx, init, call, ret)
    return None if held is None else (kind, held)


def _init_bound(ctx: _Facts, init: ast.FunctionDef, call: ast.Call, expr: ast.AST) -> ast.AST | None:
    """``expr`` of a method with ``self.attr`` and ``__init__``'s own names replaced by their one
    assignment there, and ``__init__``'s parameters by ``call``'s arguments (None if not
    in sight)."""
    params = [a.arg for a in (*init.args.posonlyargs, *init.args.args)][1:] + \
        [a.arg for a in init.args.kwonlyargs]
    defaults = dict(zip([a.arg for a in (*init.args.posonlyargs, *init.args.args)][::-1],
                        init.args.defaults[::-1], strict=False))
    defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
                     if d is not None})
    assigned: dict[str, list[ast.AST]] = {}
    for node in _own_nodes(init):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                key = dotted(target) if isinstance(target, ast.Name | ast.Attribute) else None
                if key is None:
                    for sub in ast.walk(target):  # (an unpacking: a name assigned otherwise)
                        if (k := dotted(sub) if isinstance(sub, ast.Name | ast.Attribute) else None):
                            assigned.setdefault(k, []).extend([node.value, node.value])
                    continue
                assigned.setdefault(key, []).append(node.value)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and \
                (k := dotted(node.target) if isinstance(node.target, ast.Name | ast.Attribute) else None):
            assigned.setdefault(k, []).extend([node, node] if isinstance(node, ast.AugAssign) else
                                              [node.value] if node.value is not None else [])
    failed = False

    class _Bind(ast.NodeTransformer):
        def __init__(self) -> None:
            self.depth = 0

        def _swap(self, node: ast.AST, key: str) -> ast.AST:
            nonlocal failed
            values = assigned.get(key)
            if values is not None:
                if len(values) != 1 or self.depth > _MAX_DEPTH:
                    failed = True
                    return node
                self.depth += 1
                out = self.visit(copy.deepcopy(values[0]))
                self.depth -= 1
                return out  # type: ignore[no-any-return]
            if key in params:
                arg = bound_argument(init, call, key) or defaults.get(key)
                if arg is None:
                    failed = True
                    return node
                return arg  # the caller's own node: its names are read at the call
            if key.startswith("self."):
                failed = True
            return node

        def visit_Name(self, node: ast.Name) -> ast.AST:
            return self._swap(node, node.id)

        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            key = dotted(node)
            if key is not None and key.startswith("self.") and key.count(".") == 1:
                return self._swap(node, key)
            return self.generic_visit(node)

    out = _Bind().visit(copy.deepcopy(expr))
    return None if failed else out


def returned_value(ctx: _Facts, call: ast.Call) -> ast.AST | None:
    """What ``call`` returns when it calls a function of the file (one definition of that
    name) with a single ``return <value>`` of its own; else None."""
    if not isinstance(call.func, ast.Name):
        return None
    defs = ctx.functions_by_name().get(call.func.id, [])
    if len(defs) != 1:
        return None
    fn = defs[0]
    assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    args = fn.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if params & set(_assignment_index(ctx)):
        return None  # a parameter shadows a name assigned elsewhere: its value is the caller's
    returns = [n for n in _own_nodes(fn) if isinstance(n, ast.Return)]
    return returns[0].value if len(returns) == 1 else None


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of ``fn``'s body, not those of functions or classes defined in it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _single_assignment(ctx: _Facts, name: str, at: ast.AST | None = None) -> ast.AST | None:
    """The value of the one ``name = value`` of the file, or of the function that reads it
    at ``at`` when other functions assign the name too (None if assigned otherwise too);
    for ``model, ds = build()`` or ``a, b = x, y`` the element at the name's place."""
    if at is not None and "." not in name:
        fn = _function_of(ctx, at)
        if fn is not None and name in _params(fn):
            return param_argument(ctx, fn, name)
    hits = list(_assignment_index(ctx).get(name, ()))
    if len(hits) > 1 and at is not None:
        hits = _hits_by_function(ctx, name).get(_function_of(ctx, at), [])
    if len(hits) != 1:
        return None
    names, value = hits[0]
    if names == [name]:
        return value
    if len(set(names)) != len(names) or name not in names:
        return None
    tup = value if isinstance(value, ast.Tuple) else (
        returned_value(ctx, value) if isinstance(value, ast.Call) else None)
    if (not isinstance(tup, ast.Tuple) or len(tup.elts) != len(names)
            or any(isinstance(e, ast.Starred) for e in tup.elts)):
        return None
    return tup.elts[names.index(name)]


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}


def param_argument(ctx: _Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.AST | None:
    """The argument every call of ``fn`` (by its name, one definition) gives its parameter
    ``name``, when all say the same and the function never rebinds it: the first call's own
    node, whose names are then read where that call is. None otherwise."""
    if any(isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
           for n in _own_nodes(fn)):
        return None
    if len(ctx.functions_by_name().get(fn.name, [])) != 1:
        return None
    sites = [c for c in ctx.of(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == fn.name]
    args = [bound_argument(fn, site, name) for site in sites]
    if not args or any(a is None for a in args) or len({ast.unparse(a) for a in args if a}) != 1:
        return None
    if len({_function_of(ctx, site) for site in sites}) != 1:
        return None  # (the same text in two functions may name two things)
    return args[0]


def _function_of(ctx: _Facts, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function whose own body (not a nested function, class or lambda) holds ``node``,
    else None: read up the parent map, not from a map of every node of every function."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef
                                                  | ast.ClassDef | ast.Lambda):
        cur = ctx.parents.get(cur)
    return cur if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef) else None


def _hits_by_function(ctx: _Facts, name: str) -> dict[ast.AST | None, list[tuple[list[str], ast.AST]]]:
    """The assignments of ``name`` grouped by the function that holds them (None: none), in
    order; once per name, not once per read of it (a big file assigns `loader` many times)."""
    def compute() -> dict[ast.AST | None, list[tuple[list[str], ast.AST]]]:
        out: dict[ast.AST | None, list[tuple[list[str], ast.AST]]] = {}
        for hit in _assignment_index(ctx).get(name, ()):
            out.setdefault(_function_of(ctx, hit[1]), []).append(hit)
        return out
    return ctx._cached("assign_by_function:" + name, ctx.tree, compute)  # type: ignore[no-any-return]


def _assignment_index(ctx: _Facts) -> dict[str, list[tuple[list[str], ast.AST]]]:
    """The file's assignments by target name, built once per file (a big file has many loops)."""
    def compute() -> dict[str, list[tuple[list[str], ast.AST]]]:
        out: dict[str, list[tuple[list[str], ast.AST]]] = {}
        for names, value in ctx.assignments():
            for name in set(names):
                out.setdefault(name, []).append((names, value))
        return out
    return ctx._cached("assign_by_name", ctx.tree, compute)  # type: ignore[no-any-return]


def _range_len(ctx: _Facts, call: ast.Call) -> int | None:
    args = [ctx.int_value(a, defaults=False) for a in call.args]
    if not args or any(a is None for a in args) or call.keywords:
        return None
    try:
        return len(range(*args))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _loader_len(ctx: _Facts, call: ast.Call, depth: int) -> int | None:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    if any(k in kw for k in ("sampler", "batch_sampler")) or any(k.arg is None for k in call.keywords):
        return None  # a sampler (DistributedSampler...) decides the length
    dataset = call.args[0] if call.args else kw.get("dataset")
    n = static_len(ctx, dataset, depth + 1)
    if n is None:
        return None
    bs_node = call.args[1] if len(call.args) > 1 else kw.get("batch_size")
    bs = 1 if bs_node is None else ctx.int_value(bs_node, defaults=False)
    drop = kw.get("drop_last")
    if bs is None or bs < 1 or (drop is not None and not isinstance(drop, ast.Constant)):
        return None
    drop_last = bool(drop.value) if isinstance(drop, ast.Constant) else False
    return n // bs if drop_last else -(-n // bs)


def _tensor_len(ctx: _Facts, expr: ast.AST, depth: int) -> int | None:
    """The first dimension of ``torch.randn(50, 8)``, ``torch.randint(0, 4, (50,))``,
    ``torch.arange(50)``, or of a name assigned from one."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.Name):
        value = _single_assignment(ctx, expr.id, expr)
        return None if value is None else _tensor_len(ctx, value, depth + 1)
    if isinstance(expr, ast.BinOp):
        # elementwise arithmetic keeps the first operand's rows (`randn(N, D) * 0.5 + shift`);
        # a literal first operand gives the second's
        left = None if isinstance(expr.left, ast.Constant) else _tensor_len(ctx, expr.left, depth + 1)
        if left is None and isinstance(expr.left, ast.Constant):
            return _tensor_len(ctx, expr.right, depth + 1)
        return left
    if not isinstance(expr, ast.Call):
        return None
    name = last_part(dotted(expr.func))
    kw = {k.arg: k.value for k in expr.keywords if k.arg}
    if name == "where" and len(expr.args) == 3:  # `torch.where(swap, b, a)`: its operands' rows
        return _tensor_len(ctx, expr.args[1], depth + 1)
    if name in ("arange", "randperm") and len(expr.args) == 1:
        return _int_of(ctx, expr.args[0])
    if name == "randint":
        size = kw.get("size") or (expr.args[2] if len(expr.args) > 2 else
                                  expr.args[1] if len(expr.args) == 2 else None)
        return _first_dim(ctx, size)
    if name in _SHAPED and expr.args:
        first = expr.args[0]
        return _first_dim(ctx, first) if isinstance(first, ast.Tuple | ast.List) else _int_of(ctx, first)
    return None


def _first_dim(ctx: _Facts, size: ast.AST | None) -> int | None:
    if isinstance(size, ast.Tuple | ast.List) and size.elts:
        return _int_of(ctx, size.elts[0])
    return None


def _int_of(ctx: _Facts, expr: ast.AST) -> int | None:
    """The integer ``expr`` holds (:meth:`int_value`), or for a parameter of a function of the
    file, the integer its calls all give it (``make_data(CFG["n"], 8)``)."""
    value = ctx.int_value(expr, defaults=False)
    if value is not None or not isinstance(expr, ast.Name):
        return value
    fn = _function_of(ctx, expr)
    if fn is None or expr.id not in _params(fn):
        return None
    arg = param_argument(ctx, fn, expr.id)
    return None if arg is None else ctx.int_value(arg, defaults=False)
