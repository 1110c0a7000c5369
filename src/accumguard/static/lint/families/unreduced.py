"""Parameters the ranks' gradient reduction never covers (F10): each rank steps them on its
own gradient, so the ranks' copies drift apart and none follows the large batch.

AG179: a hand-written all-reduce iterating over one parameter group
(``for p in opt.param_groups[0]["params"]: dist.all_reduce(p.grad)``) in a file that builds
an optimizer from two or more groups (a list of ``{"params": ...}`` dicts): the other groups
(typically the no-decay biases, norms and embeddings) are never averaged.

AG180: a module of the file's own that holds an ``nn.Parameter`` (a CLIP loss's learnable
temperature, a learned loss weighting), or a bare ``nn.Parameter`` made outside any module (on
a trainer object), never given to the DDP/FSDP wrapper nor to another module, that an
optimizer steps, in a file that wraps a model for data parallelism (DDP, FSDP, a DeepSpeed
engine: under ZeRO 1-3 unless that optimizer or those parameters are given to
``deepspeed.initialize``) and all-reduces no gradient by hand: the wrapper averages the
gradients of the module it wraps only.

AG183: the parameters of a hand-written reduction held in a generator that the gathering loop
consumes before the loop writing the reduced values back iterates it (zero times).

AG185: a hand-written reduction iterating a list built once from the parameters that
required a gradient then (``[p for p in model.parameters() if p.requires_grad]``), in a file
whose training loop later turns ``requires_grad`` on (an unfreeze at step N): the unfrozen
parameters train on each rank's own gradient.

AG195: the loop writing reduced gradients back assigns them to its own loop variable
(``for g, synced in zip(grads, unflatten(flat, grads)): g = synced``): rebinding the name
writes nothing into the gradient, which stays each rank's own.

AG193: inside a loop over the parameters, a hand-written all-reduce reduces a new tensor made
from the gradient (``g = p.grad / world_size``, ``p.grad.clone()``) and nothing writes it back
into ``.grad``: the gradient the optimizer steps is each rank's own.

AG337: a parameter given to ``fully_shard(..., ignored_params=...)`` (a learned temperature
FSDP2 refuses to shard) that no hand all-reduce of the file averages: FSDP2 leaves it alone,
so each rank steps its own copy on its own gradient. A reduction whose tensor cannot be told
apart (a loop over every parameter) counts as covering it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    DDP_WRAPPERS,
    OPTIMIZER_CLASSES,
    call_attr,
    dotted,
    last_part,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["copy_reduced_not_written_back", "reduces_grads_by_hand", "fsdp_ignored", "fsdp_ignored_params_never_reduced", "loop_variable_rebound", "generator_spent_before_write_back", "list_built_before_unfreeze",
           "module_outside_the_wrapper",
           "outside_modules", "reduce_over_one_group", "reduces_an_outside_module"]

_REDUCERS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
                       "reduce_scatter_tensor"})


def _one_group(it: ast.AST) -> ast.AST | None:
    """The ``X.param_groups[<int>]`` of ``X.param_groups[<int>]["params"]``, else None."""
    if not (isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Constant)
            and it.slice.value == "params"):
        return None
    grp = it.value
    if isinstance(grp, ast.Subscript) and isinstance(grp.slice, ast.Constant) \
            and isinstance(grp.slice.value, int) and isinstance(grp.value, ast.Attribute) \
            and grp.value.attr == "param_groups":
        return grp
    return None


def _reduces_grad_of(body: list[ast.stmt], var: str) -> bool:
    """A reduction in ``body`` of ``<var>.grad`` (or of ``var`` itself)."""
    for stmt in body:
        for n in walk_all(stmt):
            if not (isinstance(n, ast.Call) and call_attr(n) in _REDUCERS and n.args):
                continue
            arg = dotted(n.args[0]) or ""
            if arg in (f"{var}.grad", f"{var}.grad.data", var):
                return True
    return False


def _several_groups(ctx: FileContext) -> bool:
    """The file builds a list of two or more parameter-group dicts (``{"params": ...}``)."""
    for d in ctx.of(ast.Dict):
        lst = ctx.parents.get(d)
        if not isinstance(lst, ast.List):
            continue
        groups = [e for e in lst.elts if isinstance(e, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "params" for k in e.keys)]
        if len(groups) >= 2:
            return True
    return False


@rule("AG179")
def reduce_over_one_group(ctx: FileContext) -> Iterator[Finding]:
    if not _several_groups(ctx):
        return
    for loop in ctx.of(ast.For):
        grp = _one_group(loop.iter)
        if grp is None or not isinstance(loop.target, ast.Name) \
                or not _reduces_grad_of(loop.body, loop.target.id):
            continue
        yield ctx.finding(
            "AG179",
            loop,
            f"the gradients are all-reduced over `{ast.unparse(grp)}` only, while the "
            "optimizer is built from several parameter groups: the other groups' gradients "
            "are never averaged over the ranks, so each rank steps them on its own gradient",
        )
        return


def _param_classes(ctx: FileContext) -> set[str]:
    """Classes of the file (nn.Module subclasses) that assign an ``nn.Parameter`` to an
    attribute of ``self``."""
    out = set()
    for cls in ctx.of(ast.ClassDef):
        if not any("Module" in (dotted(b) or "") for b in cls.bases):
            continue
        for n in walk_all(cls):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) \
                    and last_part(dotted(n.value.func)) == "parameter" \
                    and any((dotted(t) or "").startswith("self.") for t in n.targets):
                out.add(cls.name)
                break
    return out


def _mentions(node: ast.AST, ref: str) -> bool:
    return any(dotted(n) == ref for n in walk_all(node))


def _stepped_by_optimizer(ctx: FileContext, ref: str, bare: bool = False) -> ast.Call | None:
    """An optimizer constructor given ``ref``'s parameters (``ref.parameters()``, or a
    parameter of it; ``ref`` itself when it is a bare parameter), directly or through a name
    assigned in the same function, or an ``add_param_group`` given it."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        callee = dotted(call.func) or ""
        if not (last_part(callee).lower() in OPTIMIZER_CLASSES
                or (bare and call_attr(call) == "add_param_group")) or not call.args:
            continue
        arg = call.args[0]
        sources: list[ast.AST] = [arg]
        if isinstance(arg, ast.Name):
            scope = ctx.scope_of(call)
            sources += ctx.assigned_in(scope).get(arg.id, [])
        for src in sources:
            for n in walk_all(src):
                d = dotted(n) or ""
                if (d.startswith(ref + ".") and d != ref + ".to") or (bare and d == ref):
                    return call
    return None


def _in_module_class(ctx: FileContext, node: ast.AST) -> bool:
    cls = ctx.enclosing(node, (ast.ClassDef,))
    return isinstance(cls, ast.ClassDef) and any("Module" in (dotted(b) or "") for b in cls.bases)


def _handed_to_initialize(ctx: FileContext, call: ast.Call, ref: str, opt: ast.Call) -> bool:
    """Under ZeRO 1-3 the engine reduces what its own optimizer holds: the outside
    parameters count as covered when their optimizer, or a name built from ``ref``, is given
    to ``deepspeed.initialize``."""
    given = [a for a in [*call.args, *(k.value for k in call.keywords)]]
    owner = ctx.parents.get(opt)
    opt_names = {dotted(t) for t in owner.targets} if isinstance(owner, ast.Assign) else set()
    for a in given:
        if a is opt or dotted(a) in opt_names:
            return True
        values: list[ast.AST] = [a]
        if isinstance(a, ast.Name):
            values += ctx.assigned_in(ctx.scope_of(call)).get(a.id, [])
        if any((dotted(n) or "").startswith(ref) for v in values for n in walk_all(v)):
            return True
    return False


def _given_away(ctx: FileContext, ref: str) -> bool:
    """``ref`` passed bare to a call (a wrapper, another module's constructor, a
    ``prepare``) or assigned as an attribute of another object (``model.weighting = ref``,
    which registers it as a submodule): it may then live inside what the wrapper averages."""
    for call in ctx.of(ast.Call):
        args = [*call.args, *(k.value for k in call.keywords)]
        if any(dotted(a) == ref for a in args):
            return True
    return any(dotted(n.value) == ref and any(isinstance(t, ast.Attribute) and dotted(t) != ref
                                              for t in n.targets) for n in ctx.of(ast.Assign))


def reduces_grads_by_hand(ctx: FileContext) -> bool:
    """The script all-reduces (or reduce-scatters) a gradient itself somewhere
    (``dist.all_reduce(p.grad)``, a callback averaging a held parameter's ``.grad``): the
    rules about gradients nothing averages stay silent."""
    for call in ctx.of(ast.Call):
        if call_attr(call) in _REDUCERS and call.args and ".grad" in ast.unparse(call.args[0]):
            return True
        if call_attr(call) in _REDUCERS and call.args \
                and "grad" in (last_part(dotted(call.args[0])) or "").lower():
            return True
    return False


def _zero0_initialize(ctx: FileContext, call: ast.Call) -> bool:
    """``deepspeed.initialize(...)`` with a config of ZeRO stage 0 (or none) read in the file:
    the engine all-reduces the gradients of its module's parameters only (ZeRO 1-3 reduce
    what their optimizer holds)."""
    if (dotted(call.func) or "") != "deepspeed.initialize":
        return False
    ref = ctx.ds_config()
    return ref is not None and ref.stage in (None, 0)


def outside_modules(ctx: FileContext) -> list[tuple[str, str, ast.Call]]:
    """(reference, class, optimizer call) of each module of the file's own classes holding
    an ``nn.Parameter``, instantiated on its own (never given to a wrapper or another call)
    and stepped by an optimizer, in a file that wraps a model for data parallelism."""
    def compute() -> list[tuple[str, str, ast.Call]]:
        wrappers = [c for c in ctx.of(ast.Call) if call_attr(c) in DDP_WRAPPERS
                    or (dotted(c.func) or "") == "deepspeed.initialize"]
        classes = _param_classes(ctx) if wrappers else set()
        out = []
        for node in ctx.of(ast.Assign) if wrappers else []:
            if not (isinstance(node.value, ast.Call) and len(node.targets) == 1):
                continue
            cls = (dotted(node.value.func) or "").rsplit(".", 1)[-1]
            bare = cls == "Parameter" and not _in_module_class(ctx, node)
            ref = dotted(node.targets[0])
            if not (cls in classes or bare) or ref is None or _given_away(ctx, ref) \
                    or any(_mentions(w, ref) for w in wrappers):
                continue
            opt = _stepped_by_optimizer(ctx, ref, bare)
            if opt is None or any(
                    (dotted(w.func) or "") == "deepspeed.initialize" and not _zero0_initialize(ctx, w)
                    and _handed_to_initialize(ctx, w, ref, opt) for w in wrappers):
                continue
            out.append((ref, "" if bare else cls, opt))
        return out
    return ctx._cached("outside_modules", ctx.tree, compute)  # type: ignore[no-any-return]


def reduces_an_outside_module(ctx: FileContext, reduce: ast.AST) -> bool:
    """A gradient reduction that covers a module outside the wrapper (the loop around it
    iterates over that module's parameters, or its argument names them): the wrapper never
    averaged those gradients, so reducing them by hand is the fix, not a second average."""
    refs = [ref for ref, _, _ in outside_modules(ctx)]
    if not refs:
        return False
    scopes: list[ast.AST] = [reduce]
    loop = ctx.enclosing(reduce, (ast.For,))
    if isinstance(loop, ast.For):
        scopes.append(loop.iter)
    return any((dotted(n) or "").startswith(ref + ".") for s in scopes for n in walk_all(s)
               for ref in refs)


@rule("AG180")
def module_outside_the_wrapper(ctx: FileContext) -> Iterator[Finding]:
    if reduces_grads_by_hand(ctx):
        return
    for ref, cls, opt in outside_modules(ctx):
        what = (f"a `{cls}`, which holds an nn.Parameter" if cls
                else "an nn.Parameter held outside any module")
        stepped = f"`{ref}`'s parameters" if cls else f"`{ref}`"
        yield ctx.finding(
            "AG180",
            opt,
            f"`{ref}` ({what}) is stepped by this optimizer "
            "but is not inside the module the data-parallel wrapper holds, and the script "
            "all-reduces no gradient itself: the wrapper averages its own module's gradients "
            f"only, so each rank steps {stepped} on its own gradient",
        )
        return


def _iterations(fn: ast.AST, name: str) -> list[ast.AST]:
    """The places in ``fn`` that iterate over the plain name ``name``: ``for ... in name``,
    a comprehension over it, or ``zip``/``list``/``tuple``/``enumerate``/``sum`` of it."""
    out: list[ast.AST] = []
    for n in walk_all(fn):
        looped = isinstance(n, ast.For | ast.comprehension) and isinstance(n.iter, ast.Name) \
            and n.iter.id == name
        consumed = isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
            and n.func.id in ("zip", "list", "tuple", "enumerate", "sum", "sorted") \
            and any(isinstance(a, ast.Name) and a.id == name for a in n.args)
        if looped or consumed:
            out.append(n)
    return out


def _writes_grad(node: ast.AST, fn: ast.AST) -> bool:
    """A ``.grad`` written (``p.grad.copy_(g)``, ``p.grad = g``, ``p.grad /= w``) in the loop
    ``node`` belongs to (or in ``node`` itself)."""
    loop = node
    for cand in walk_all(fn):
        if isinstance(cand, ast.For) and any(x is node for x in walk_all(cand.iter)):
            loop = cand
    for n in walk_all(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr in ("copy_", "div_", "mul_", "set_") \
                and (dotted(n.func.value) or "").endswith(".grad"):
            return True
        if isinstance(n, ast.Assign | ast.AugAssign):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any((dotted(t) or "").endswith(".grad") for t in targets):
                return True
    return False


@rule("AG183")
def generator_spent_before_write_back(ctx: FileContext) -> Iterator[Finding]:
    """AG183 (F10): the parameters of a hand-written gradient reduction held in a generator
    (``params = (p for p in model.parameters() if p.grad is not None)``) that one loop
    consumes (gathering the gradients to reduce) before another iterates it to write the
    reduced values back into ``.grad``: a generator runs once, the second loop runs zero
    times, and each rank's optimizer steps its own gradient."""
    for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
        if not any(isinstance(n, ast.Call) and call_attr(n) in _REDUCERS for n in walk_all(fn)):
            continue
        for name, values in ctx.assigned_in(fn).items():
            if len(values) != 1 or not isinstance(values[0], ast.GeneratorExp):
                continue
            uses = sorted(_iterations(fn, name), key=lambda n: (getattr(n, "lineno", 0),
                                                                 getattr(n, "col_offset", 0)))
            if len(uses) < 2 or not any(_writes_grad(u, fn) for u in uses[1:]):
                continue
            yield ctx.finding(
                "AG183",
                values[0],
                f"`{name}` is a generator, and it is iterated twice (line "
                f"{getattr(uses[0], 'lineno', '?')} and line {getattr(uses[1], 'lineno', '?')}):"
                " the first pass consumes it, so the loop writing the reduced gradients back "
                "into .grad runs zero times and each rank steps its own gradient",
                fix="make it a list: `params = [p for p in model.parameters() if p.grad is not "
                    "None]`",
            )
            return


def _trainable_list(value: ast.AST) -> bool:
    """``[p for p in m.parameters() if p.requires_grad]`` or ``list(filter(lambda p:
    p.requires_grad, m.parameters()))``: the parameters that require a gradient now."""
    if isinstance(value, ast.Call) and dotted(value.func) == "list" and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        gen = value.generators[0]
        return isinstance(gen.iter, ast.Call) and call_attr(gen.iter) in ("parameters", "values") and any(
            "requires_grad" in ast.unparse(t) for t in gen.ifs)
    if isinstance(value, ast.Call) and dotted(value.func) == "filter" and len(value.args) == 2:
        return "requires_grad" in ast.unparse(value.args[0]) \
            and isinstance(value.args[1], ast.Call) and call_attr(value.args[1]) == "parameters"
    return False


def _unfreezes_in_training(ctx: FileContext) -> ast.AST | None:
    """A ``requires_grad_()`` / ``requires_grad_(True)`` call or ``.requires_grad = True``
    inside a loop that also runs a backward or an optimizer step (an unfreeze mid-run)."""
    for n in walk_all(ctx.tree):
        on = (isinstance(n, ast.Call) and call_attr(n) == "requires_grad_"
              and (not n.args or (isinstance(n.args[0], ast.Constant) and n.args[0].value is True)))
        on = on or (isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets)
            and isinstance(n.value, ast.Constant) and n.value.value is True)
        if not on:
            continue
        loop = ctx.parents.get(n)
        while loop is not None:
            if isinstance(loop, ast.For | ast.While) and any(
                    isinstance(c, ast.Call) and call_attr(c) in ("backward", "step")
                    for c in walk_all(loop)):
                return n
            loop = ctx.parents.get(loop)
    return None


@rule("AG185")
def list_built_before_unfreeze(ctx: FileContext) -> Iterator[Finding]:
    built: dict[str, list[ast.AST]] = {}
    for targets, value in ctx.assignments():
        for t in targets:
            built.setdefault(t, []).append(value)
    lists = {name for name, values in built.items()
             if len(values) == 1 and _trainable_list(values[0])}
    if not lists:
        return
    unfreeze = None
    for loop in ctx.of(ast.For):
        name = dotted(loop.iter)
        if name not in lists or not isinstance(loop.target, ast.Name) \
                or not _reduces_grad_of(loop.body, loop.target.id):
            continue
        unfreeze = unfreeze or _unfreezes_in_training(ctx)
        if unfreeze is None:
            return
        yield ctx.finding(
            "AG185",
            loop,
            f"the gradients are all-reduced over `{name}`, the parameters that required a "
            f"gradient when it was built (`{ast.unparse(built[name][0])}`), but line "
            f"{getattr(unfreeze, 'lineno', '?')} turns requires_grad on during training: the "
            "parameters unfrozen then get gradients that are never averaged over the ranks, so "
            "each rank steps them on its own gradient",
        )
        return


def _new_from_grad(value: ast.AST, var: str) -> bool:
    """``value`` makes a new tensor from ``<var>.grad``: arithmetic on it (``p.grad / W``) or
    a ``.clone()`` (``.detach()``, ``.float()``, ``.to()`` may return the same storage)."""
    grads = {f"{var}.grad", f"{var}.grad.data"}
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div | ast.Mult | ast.Add | ast.Sub):
        return any(dotted(side) in grads for side in (value.left, value.right))
    if isinstance(value, ast.Call) and call_attr(value) == "clone" \
            and isinstance(value.func, ast.Attribute):
        inner = value.func.value
        if isinstance(inner, ast.Call) and call_attr(inner) == "detach" and isinstance(inner.func, ast.Attribute):
            inner = inner.func.value
        return dotted(inner) in grads
    return False


def _writes_back(body: list[ast.stmt], var: str, name: str) -> bool:
    """Something in ``body`` writes ``name`` (or anything) into ``<var>.grad``."""
    for stmt in body:
        for n in walk_all(stmt):
            if isinstance(n, ast.Assign | ast.AugAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any((dotted(t) or "").startswith(f"{var}.grad") for t in targets):
                    return True
            if isinstance(n, ast.Call) and call_attr(n) in ("copy_", "set_", "add_") \
                    and isinstance(n.func, ast.Attribute) \
                    and (dotted(n.func.value) or "").startswith(f"{var}.grad"):
                return True
    return False


@rule("AG193")
def copy_reduced_not_written_back(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name) \
                or not (isinstance(loop.iter, ast.Call) and call_attr(loop.iter) == "parameters"
                        or "param" in (dotted(loop.iter) or "").lower()):
            continue
        var = loop.target.id
        made = {}
        for stmt in loop.body:
            for n in walk_all(stmt):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                        and isinstance(n.targets[0], ast.Name) and _new_from_grad(n.value, var):
                    made[n.targets[0].id] = n
        for stmt in loop.body:
            for n in walk_all(stmt):
                if not (isinstance(n, ast.Call) and call_attr(n) in _REDUCERS and n.args
                        and isinstance(n.args[0], ast.Name) and n.args[0].id in made):
                    continue
                name = n.args[0].id
                if _writes_back(loop.body, var, name):
                    continue
                yield ctx.finding(
                    "AG193",
                    n,
                    f"`{ast.unparse(n)}` reduces `{name}`, a new tensor "
                    f"(`{ast.unparse(made[name].value)}`, line {made[name].lineno}), and nothing "
                    f"writes it back into `{var}.grad`: the gradient the optimizer steps is never "
                    "averaged over the ranks, each rank steps on its own",
                    fix=f"reduce the gradient itself: `{var}.grad /= world_size; "
                        f"dist.all_reduce({var}.grad)` (or copy the result back with "
                        f"`{var}.grad.copy_({name})`)",
                )
                return


@rule("AG195")
def loop_variable_rebound(ctx: FileContext) -> Iterator[Finding]:
    """AG195 (F10): a write-back loop that rebinds its own loop variable to the reduced
    value, in a function that all-reduces: the assignment changes the name, not the tensor."""
    for loop in ctx.of(ast.For):
        if not isinstance(loop, ast.For):
            continue
        targets = [loop.target] if isinstance(loop.target, ast.Name) else list(
            loop.target.elts) if isinstance(loop.target, ast.Tuple) else []
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if not names:
            continue
        for stmt in loop.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id in names
                    and isinstance(stmt.value, ast.Name) and stmt.value.id in names):
                continue
            fn = ctx.enclosing(loop, (ast.FunctionDef, ast.AsyncFunctionDef)) or ctx.tree
            if not ctx._cached("reduces_in", fn, lambda fn=fn: any(  # (once per function)
                    isinstance(n, ast.Call) and call_attr(n) in _REDUCERS for n in walk_all(fn))):
                break
            name = stmt.targets[0].id
            # (the rebound name read later in the body would be a local alias, not a write)
            if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                   for st in loop.body if st is not stmt and st.lineno > stmt.lineno
                   for n in ast.walk(st)):
                continue
            yield ctx.finding(
                "AG195",
                stmt,
                f"`{ast.unparse(stmt)}` rebinds the loop variable `{name}` to the reduced "
                f"value: the tensor `{name}` named is left as it was, so the reduced gradients "
                "never reach .grad and each rank steps on its own",
                fix=f"write into the tensor: `{name}.copy_({stmt.value.id})`",
            )
            return


def fsdp_ignored(ctx: FileContext) -> list[tuple[ast.Call, list[str]]]:
    """``fully_shard(module, ignored_params={model.logit_scale, ...})`` calls with the
    ignored parameters' attribute names: FSDP2 neither shards nor reduces them."""
    out: list[tuple[ast.Call, list[str]]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) != "fully_shard":
            continue
        given = next((k.value for k in call.keywords if k.arg == "ignored_params"), None)
        if isinstance(given, ast.Name):
            values = ctx.assigned_in(ctx.scope_of(call)).get(given.id, [])
            given = values[0] if len(values) == 1 else given
        if isinstance(given, ast.Call) and dotted(given.func) in ("set", "list", "tuple") and given.args:
            given = given.args[0]
        if isinstance(given, ast.Set | ast.List | ast.Tuple):
            names = [n for e in given.elts if (n := last_part(dotted(e) or "")) and dotted(e)]
            if names:
                out.append((call, names))
    return out


def _grad_reductions(ctx: FileContext) -> list[set[str]]:
    """Per hand reduction of a gradient, the attribute names its tensor is made from (the
    argument, and the values its name was assigned in that scope)."""
    out: list[set[str]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) not in _REDUCERS or not call.args:
            continue
        exprs: list[ast.AST] = [call.args[0]]
        if isinstance(call.args[0], ast.Name):
            exprs += ctx.assigned_in(ctx.scope_of(call)).get(call.args[0].id, [])
        attrs = {n.attr for e in exprs for n in walk_all(e) if isinstance(n, ast.Attribute)}
        if "grad" in attrs or "grad" in ast.unparse(call.args[0]):
            out.append(attrs)
    return out


@rule("AG337")
def fsdp_ignored_params_never_reduced(ctx: FileContext) -> Iterator[Finding]:
    ignored = fsdp_ignored(ctx)
    if not ignored:
        return
    reductions = _grad_reductions(ctx)
    for call, names in ignored:
        missing = [n for n in names if not any(n in attrs or len(attrs) <= 1 for attrs in reductions)]
        if not missing:
            continue
        yield ctx.finding(
            "AG337",
            call,
            f"`{', '.join(missing)}` is in `fully_shard`'s ignored_params: FSDP2 neither shards "
            "nor reduces it, and no all-reduce of the file averages its gradient, so each rank "
            "steps its own copy on its own gradient and the copies drift apart",
        )
