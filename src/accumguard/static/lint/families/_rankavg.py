"""What a DDP/FSDP/Accelerate wrapper's average over ranks does to a loss, as the loss rules
(AG112, AG113, AG123) read it from the source: a changed rank reduction (a divide factor, a
comm hook), counts all-reduced by a helper of the file, single-process reference models beside
the wrapped one, and a loss scaled by ``1 / count``."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.lint._ast import (
    DDP_WRAPPERS,
    FUNCS,
    GLOBAL_COUNT_RE,
    GRAD_TENSOR_RE,
    call_attr,
    dotted,
    identifiers,
    last_part,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_file import read_of
from accumguard.static.lint._lengths import param_argument

__all__ = ["custom_rank_reduction", "grad_all_reduces", "hand_average", "local_count", "plain_model_only",
           "reciprocal_products", "returned_reduced", "simulates_ranks", "summed_over_ranks"]


#: Calls that change what DDP/FSDP does to the gradients across ranks: with them in the file
#: the wrapper's plain average over W is not what runs (FSDP2's divide factor set to 1 sums).
_REDUCTION_CHANGED = frozenset({"set_gradient_divide_factor", "set_reduce_scatter_divide_factor",
                                "register_comm_hook", "set_all_reduce_hook",
                                "set_force_sum_reduction_for_comms"})


def custom_rank_reduction(ctx: FileContext) -> bool:
    """The file changes the wrapper's reduction over ranks (a divide factor, a comm hook):
    the rules that assume DDP/FSDP's average say nothing. torch's own averaging hooks
    (``default_hooks.allreduce_hook``, the fp16/bf16 compression hooks) keep the average."""
    return any((call_attr(c) or "") in _REDUCTION_CHANGED and not _averaging_hook(c)
               for c in ctx.of(ast.Call))


#: DDP comm hooks of torch that all-reduce and divide by the process group's size
_AVERAGING_HOOKS = frozenset({"allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"})


def _averaging_hook(call: ast.Call) -> bool:
    if call_attr(call) != "register_comm_hook":
        return False
    hook = next((k.value for k in call.keywords if k.arg == "hook"),
                call.args[1] if len(call.args) > 1 else None)
    return last_part(dotted(hook)) in _AVERAGING_HOOKS


def _wrapped_names(scope: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    """Names ``scope`` hands to a DDP/FSDP wrapper or assigns from one
    (``fully_shard(model)``, ``model = DDP(model)``)."""
    out: set[str] = set()
    for call in ast.walk(scope):
        if not isinstance(call, ast.Call) or (call_attr(call) or "") not in DDP_WRAPPERS:
            continue
        out |= {d for a in call.args[:1] if (d := dotted(a)) is not None}
        parent = parents.get(call)
        if isinstance(parent, ast.Assign):
            out |= {d for t in parent.targets if (d := dotted(t)) is not None}
    return out


def _file_function_without(ctx: FileContext, name: str, calls: frozenset[str]) -> bool:
    """``name`` is one function of this file, and its body calls none of ``calls``."""
    defs = ctx.functions_by_name().get(name, [])
    return len(defs) == 1 and not any(
        isinstance(c, ast.Call) and (call_attr(c) or "") in calls for c in ast.walk(defs[0]))


_REDUCES = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "gather",
                      "reduce_tensor", "sync_tensor"})


def _divisor_values(ctx: FileContext, divisor: ast.AST) -> list[ast.AST]:
    """The divisor and the values its names are assigned in its function (the whole value
    of an unpacking: ``n_samples, n_tokens = self._window_counts(batches)``)."""
    func = ctx.enclosing(divisor, FUNCS)
    exprs = [divisor]
    if func is not None:
        names = {x.id for x in walk_all(divisor) if isinstance(x, ast.Name)}
        fields = {d for x in walk_all(divisor) if isinstance(x, ast.Attribute)
                  and (d := dotted(x)) is not None}  # `self._window_tokens`
        exprs += [n.value for n in ast.walk(func) if isinstance(n, ast.Assign)
                  and len(n.targets) == 1 and (_binds(n.targets[0], names)
                                               or dotted(n.targets[0]) in fields)]
    return exprs


def _binds(target: ast.AST, names: set[str]) -> bool:
    """``target`` is one of ``names``, or a tuple/list unpacking one of them."""
    if isinstance(target, ast.Name):
        return target.id in names
    return isinstance(target, ast.Tuple | ast.List) and any(
        isinstance(e, ast.Name) and e.id in names for e in target.elts)


def returned_reduced(ctx: FileContext, divisor: ast.AST, *, summed: bool = False) -> bool:
    """The count is what a function of this file returns after an all-reduce in its body
    (``denom = self.global_token_count(mbs)``), directly or through a local name; with
    ``summed``, every reduction there sums (torch's default op)."""
    exprs = _divisor_values(ctx, divisor)
    for e in exprs:
        for c in walk_all(e):
            if not isinstance(c, ast.Call):
                continue
            defs = ctx.functions_by_name().get(call_attr(c) or "", [])
            if len(defs) != 1:
                continue
            reductions = [x for x in ast.walk(defs[0]) if isinstance(x, ast.Call)
                          and (call_attr(x) or "") in _REDUCES]
            if reductions and (not summed or all(_sums(x) for x in reductions)) \
                    and _returns_reduced(defs[0], reductions):
                return True
    return False


def _returns_reduced(fn: ast.AST, reductions: list[ast.Call]) -> bool:
    """Some ``return`` of ``fn`` reads a value it reduced (the all-reduced name, a name
    assigned from it, or the reduction itself): ``n_global = n.clone(); all_reduce(n_global);
    return n_local`` reduces one count and returns the other."""
    reduced = {d for r in reductions for a in r.args[:1] for x in ast.walk(a) if (d := dotted(x))}
    for _ in range(2):
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and any(dotted(x) in reduced for x in ast.walk(n.value)):
                reduced |= {d for t in n.targets for x in ast.walk(t) if (d := dotted(x))}
    rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    return not rets or any(
        any(dotted(x) in reduced for x in ast.walk(v)) or any(x in reductions for x in ast.walk(v))
        for v in rets)


def _op(call: ast.Call) -> ast.AST | None:
    op = next((k.value for k in call.keywords if k.arg == "op"), None)
    return call.args[1] if op is None and len(call.args) > 1 else op


def _sums(call: ast.Call) -> bool:
    """An all-reduce whose op is a sum (given as ``SUM`` or left to torch's default)."""
    if call_attr(call) != "all_reduce":
        return False
    op = _op(call)
    return op is None or (dotted(op) or "").upper().endswith("SUM")


def plain_model_only(ctx: FileContext, dividend: ast.AST) -> bool:
    """Every module the loss calls is a local name its function builds from a class
    (``ref = LM()``, ``copy.deepcopy(...)``) and never wraps: a single-process reference run in a DDP/FSDP
    script, whose gradient no rank average touches."""
    func = ctx.enclosing(dividend, FUNCS)
    if func is None:
        return False
    wrapped = _wrapped_names(func, ctx.parents)  # (another function's `model` is another)
    built: dict[str, bool] = {}  # local name -> assigned only from a class built here
    values: dict[str, list[ast.AST]] = {}  # local name -> the values assigned to it
    aliases: dict[str, list[str]] = {}  # local name -> the names assigned to it
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple):
            made = call_attr(n.value) or "" if isinstance(n.value, ast.Call) else ""
            # ``policy, critic = make_models(cfg)``: a factory of this file that wraps nothing
            factory = made not in DDP_WRAPPERS and made != "prepare" \
                and _file_function_without(ctx, made, DDP_WRAPPERS)
            for e in n.targets[0].elts:  # ``_, loss_sum = ref(X, Y)``
                if isinstance(e, ast.Name):
                    values.setdefault(e.id, []).append(n.value)
                    # (``model, opt = accelerator.prepare(...)``: wrapped)
                    built[e.id] = built.get(e.id, True) and factory
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            name = n.targets[0].id
            values.setdefault(name, []).append(n.value)
            if isinstance(n.value, ast.Name):  # `ref = init`: plain when what it names is
                aliases.setdefault(name, []).append(n.value.id)
                continue
            made = call_attr(n.value) or "" if isinstance(n.value, ast.Call) else ""
            # a class built here (``LM()``, ``GPT(cfg)``), a deep copy, or a factory of this
            # file that wraps nothing (a factory out of sight may return a wrapped model)
            plain = made not in DDP_WRAPPERS and (made[:1].isupper() or made == "deepcopy"
                                                  or _file_function_without(ctx, made, DDP_WRAPPERS))
            built[name] = built.get(name, True) and plain
    for name, sources in aliases.items():
        built[name] = built.get(name, True) and all(built.get(src, False) for src in sources)
    # the modules called in the loss, or in what its names were assigned (``logits = ref(x)``)
    # (only the write that reaches the loss when one does: a reference loop after the
    # training loop reassigns the training's names, ``_, loss_sum = ref(xb, yb)``)
    exprs = [dividend, *(v for x in walk_all(dividend) if isinstance(x, ast.Name)
                         for v in _reaching_values(ctx, func, x, values.get(x.id, [])))]
    called = {c.func.id for e in exprs for c in walk_all(e)
              if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    models = [c for c in called if c in built]
    # (a module handed to a loss helper, ``ce_sum(model, x, y)``, built from a class: data
    # tensors among the arguments are no modules)
    models += [a.id for e in exprs for c in walk_all(e) if isinstance(c, ast.Call)
               for a in c.args if isinstance(a, ast.Name) and built.get(a.id)]
    return bool(models) and all(built[m] and m not in wrapped for m in models)


def _reaching_values(ctx: FileContext, func: ast.AST, name: ast.Name, values: list[ast.AST]) -> list[ast.AST]:
    """The value ``name`` holds at its use when one plain or tuple assignment reaches it, else
    every value the function assigns it."""
    write = ctx.reaching_write(func, name.id, name)
    return [write.value] if isinstance(write, ast.Assign) else values


def local_count(ctx: FileContext, node: ast.AST, names: set[str]) -> bool:
    """The count is assigned in the function around ``node`` and no name of it says it
    spans the window or the ranks (``window_tokens``, ``global_count``)."""
    func = ctx.enclosing(node, FUNCS)
    if func is None or any(GLOBAL_COUNT_RE.search(n.lower()) for n in names):
        return False
    assigned = {t.id for a in ast.walk(func) if isinstance(a, ast.Assign)
                for t in a.targets if isinstance(t, ast.Name)}
    return bool(names & assigned)


def reciprocal_products(ctx: FileContext) -> Iterator[tuple[ast.AST, ast.AST, ast.AST]]:
    """``loss * scale`` where ``scale`` is assigned once in its function as ``1 / count``:
    (the product, the other factor, the count), as a division by the count."""
    for node in ctx.of(ast.BinOp):
        if not isinstance(node.op, ast.Mult):
            continue
        func = ctx.enclosing(node, FUNCS)
        for factor, other in ((node.right, node.left), (node.left, node.right)):
            if not isinstance(factor, ast.Name) or func is None:
                continue
            values = [a.value for a in ast.walk(func) if isinstance(a, ast.Assign)
                      and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
                      and a.targets[0].id == factor.id]
            v = values[0] if len(values) == 1 else None
            if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div) \
                    and isinstance(v.left, ast.Constant) and v.left.value in (1, 1.0):
                yield node, other, v.right
                break
            ret = _returned_division(ctx, v)
            if ret is not None:
                yield node, other, ret.right
                break


def _returned_division(ctx: FileContext, value: ast.AST | None) -> ast.BinOp | None:
    """``mult = loss_multiplier(window, K)`` where the file's one function of that name has
    one ``return``, a division (``return K / n``, ``return K * W / n``): the scale is a
    division by that function's count."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return None
    fns = ctx.functions_by_name().get(value.func.id, [])
    if len(fns) != 1:
        return None
    rets = [r for r in ast.walk(fns[0]) if isinstance(r, ast.Return) and r.value is not None]
    if len(rets) != 1:
        return None
    ret = rets[0].value
    return ret if isinstance(ret, ast.BinOp) and isinstance(ret.op, ast.Div) else None


# ---------------------------------------------------------------- counts summed over ranks


def summed_over_ranks(ctx: FileContext, divisor: ast.AST, *, accelerate: bool) -> bool:
    """``divisor`` is a count summed over every rank: a name all-reduced with SUM (torch's
    default op) in the file, what a helper of the file returns after summing all-reduces, or
    (``accelerate``) Accelerate's ``accelerator.reduce(n)`` / ``accelerator.gather(n).sum()``."""
    names = {x for x in (dotted(s) for s in walk_all(divisor)) if x}
    reduced = names & (ctx.all_reduced_names(ctx.scope_of(divisor))
                       | ctx.all_reduced_names(ctx.tree))
    summed, not_summed = _all_reduce_ops(ctx)
    return bool(reduced & summed and not reduced & not_summed) \
        or returned_reduced(ctx, divisor, summed=True) \
        or (accelerate and _accelerate_summed(ctx, divisor))


def _all_reduce_ops(ctx: FileContext) -> tuple[set[str], set[str]]:
    """The names in the first argument of the file's ``all_reduce`` calls, and those of the
    calls whose op is not a sum: one pass (cached), not one per division."""
    def compute() -> tuple[set[str], set[str]]:
        reduced: set[str] = set()
        not_summed: set[str] = set()
        for call in ctx.of(ast.Call):
            if call_attr(call) != "all_reduce" or not call.args:
                continue
            names = {d for d in (dotted(s) for s in walk_all(call.args[0])) if d}
            reduced |= names
            if not _sums(call):
                not_summed |= names
        for _ in range(2):  # `n = total.item()`, `float(total)`: the same ranks' sum (or not)
            for node in ctx.of(ast.Assign):
                src = read_of(node.value)
                if src in reduced and len(node.targets) == 1 and (t := dotted(node.targets[0])):
                    reduced.add(t)
                    if src in not_summed:
                        not_summed.add(t)
        return reduced, not_summed
    return ctx._cached("all_reduce_ops", ctx.tree, compute)  # type: ignore[no-any-return]


def _accelerate_summed(ctx: FileContext, divisor: ast.AST) -> bool:
    """Accelerate sums the count over the processes, in the division or in a local name's
    value in the same function."""
    exprs = _divisor_values(ctx, divisor)
    return any(_accelerate_sum_call(ctx, c) for e in exprs for c in walk_all(e)
               if isinstance(c, ast.Call))


def _accelerate_sum_call(ctx: FileContext, call: ast.Call) -> bool:
    """``accelerator.reduce(n)`` (a sum unless told otherwise) or
    ``accelerator.gather(n).sum()`` / ``torch.sum(accelerator.gather(n))``."""
    attr = call_attr(call)
    if attr == "reduce" and ctx.is_accelerator(receiver(call)):
        how = next((k.value for k in call.keywords if k.arg == "reduction"), None)
        if how is None and len(call.args) > 1:
            how = call.args[1]
        return how is None or (isinstance(how, ast.Constant) and how.value == "sum")
    if attr == "sum":
        inner = call.args[0] if call.args else receiver(call)
        return (isinstance(inner, ast.Call) and call_attr(inner) in ("gather", "gather_for_metrics")
                and ctx.is_accelerator(receiver(inner)))
    return False


# ---------------------------------------------------------------- gradients averaged by hand


def hand_average(ctx: FileContext) -> list[ast.AST]:
    """Where the file averages the gradients over ranks by hand: an ``all_reduce`` of
    gradients with op ``AVG``, or a summing one followed in the same function by a division
    of gradients by the world size (``p.grad.div_(world)``, ``buf /= W``). Empty when none."""
    def compute() -> list[ast.AST]:
        out: list[ast.AST] = []
        divisions = [n for n in ctx.of(ast.Call, ast.AugAssign) if _divides_grads_by_world(ctx, n)]
        for call in ctx.of(ast.Call):
            if call_attr(call) in _SCATTERS and len(call.args) >= 2 \
                    and _grad_tensor(ctx, call.args[1]) and isinstance(call.args[0], ast.Name):
                # a hand-written ZeRO: `reduce_scatter_tensor(out, grad_bucket, op=SUM)`, then
                # `out.div_(world)` (the output shard holds the reduced gradient)
                func = ctx.enclosing(call, FUNCS)
                op = next((k.value for k in call.keywords if k.arg == "op"),
                          call.args[2] if len(call.args) > 2 else None)
                how = (dotted(op) or "").upper() if op is not None else "SUM"
                if how.endswith("AVG"):
                    out.append(call)
                elif how.endswith("SUM"):
                    out += [n for n in ctx.of(ast.Call, ast.AugAssign)
                            if getattr(n, "lineno", 0) >= call.lineno and n not in out
                            and ctx.enclosing(n, FUNCS) is func
                            and _divides_by_world(ctx, n, call.args[0].id)]
                continue
            if call_attr(call) != "all_reduce" or not call.args \
                    or not _grad_tensor(ctx, call.args[0]):
                continue
            if _averages(call):
                out.append(call)
            elif _sums(call):
                func = ctx.enclosing(call, FUNCS)
                out += [n for n in divisions if getattr(n, "lineno", 0) >= call.lineno
                        and ctx.enclosing(n, FUNCS) is func and n not in out]
        return out
    return ctx._cached("hand_average", ctx.tree, compute)  # type: ignore[no-any-return]


def grad_all_reduces(ctx: FileContext) -> list[ast.Call]:
    """Every ``all_reduce`` of gradients in the file (``p.grad``, ``grads``, a flat bucket
    of them), whatever its op: the script synchronises gradients by hand there."""
    return [c for c in ctx.of(ast.Call) if call_attr(c) == "all_reduce" and c.args
            and _grad_tensor(ctx, c.args[0])]


def _averages(call: ast.Call) -> bool:
    op = _op(call)
    return op is not None and (dotted(op) or "").upper().endswith("AVG")


#: reduce-scatters: (output, input, ...) by position
_SCATTERS = frozenset({"reduce_scatter_tensor", "_reduce_scatter_base"})


def _divides_by_world(ctx: FileContext, n: ast.AST, name: str) -> bool:
    """``name.div_(W)`` or ``name /= W``."""
    if isinstance(n, ast.Call) and call_attr(n) == "div_" and len(n.args) == 1:
        return dotted(receiver(n)) == name and ctx.mentions_world(n.args[0])
    return isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) \
        and dotted(n.target) == name and ctx.mentions_world(n.value)


def _divides_grads_by_world(ctx: FileContext, n: ast.AST) -> bool:
    """``g.div_(W)``, ``g.mul_(1 / W)`` or ``g /= W`` on gradients."""
    target: ast.AST | None
    if isinstance(n, ast.Call) and call_attr(n) in ("div_", "mul_") and len(n.args) == 1:
        target, by = receiver(n), n.args[0]
        if call_attr(n) == "mul_":
            if not (isinstance(by, ast.BinOp) and isinstance(by.op, ast.Div)):
                return False
            by = by.right
    elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div):
        target, by = n.target, n.value
    else:
        return False
    return target is not None and _grad_tensor(ctx, target) and ctx.mentions_world(by) \
        and not _switched_off(ctx, n)


def _switched_off(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` runs only under ``if flag:``, ``flag`` a parameter of its function to which
    every call of the function passes the same false constant (``average=False``): a
    division the script never makes."""
    cur: ast.AST | None = ctx.parents.get(node)
    child: ast.AST = node
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, ast.If) and child in cur.body and isinstance(cur.test, ast.Name):
            fn = ctx.enclosing(cur, FUNCS)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and cur.test.id in {
                    a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}:
                arg = param_argument(ctx, fn, cur.test.id)
                if isinstance(arg, ast.Constant) and not arg.value:
                    return True
        child, cur = cur, ctx.parents.get(cur)
    return False


def _grad_tensor(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` names gradients (``grads``, ``p.grad``), or is a name its function assigns
    once from them (``buf = _flatten_dense_tensors(grads)``)."""
    if any(GRAD_TENSOR_RE.search(i) for i in identifiers(expr)):
        return True
    if not isinstance(expr, ast.Name):
        return False
    values = ctx.assigned_in(ctx.enclosing(expr, FUNCS) or ctx.tree).get(expr.id, [])
    return len(values) == 1 and any(GRAD_TENSOR_RE.search(i) for i in identifiers(values[0]))


def simulates_ranks(ctx: FileContext, node: ast.AST) -> bool:
    """A loop around ``node`` loops over the ranks itself, or holds a loop over them
    (``for r in range(world)``, a comprehension over them): one process standing for every
    rank (a large-batch reference), whose division by W is the large batch's, not a second
    average."""
    loop = ctx.enclosing(node, (ast.For, ast.AsyncFor, ast.While))
    while loop is not None:
        for n in [loop, *ctx.local_nodes(loop)]:
            it = n.iter if isinstance(n, ast.For | ast.AsyncFor | ast.comprehension) else None
            if isinstance(it, ast.Call) and call_attr(it) == "range" and it.args \
                    and ctx.mentions_world(it.args[-1]):
                return True
        loop = ctx.enclosing(loop, (ast.For, ast.AsyncFor, ast.While))
    return False


def reaches_hand_average(ctx: FileContext, node: ast.AST, averages: list[ast.AST]) -> bool:
    """A loop around ``node`` runs a hand-written gradient average (:func:`hand_average`):
    holds it, or calls the function of the file that holds it (``allreduce_grads(model)``
    after the window)."""
    homes = {fn.name for a in averages if isinstance(fn := ctx.enclosing(a, FUNCS), FUNCS)}
    loop = ctx.enclosing(node, (ast.For, ast.AsyncFor, ast.While))
    while loop is not None:
        for n in ctx.local_nodes(loop):
            if n in averages or (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                                 and n.func.id in homes):
                return True
        loop = ctx.enclosing(loop, (ast.For, ast.AsyncFor, ast.While))
    return False
