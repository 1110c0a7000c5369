"""Parameters the ranks' gradient reduction never covers (F10): each rank steps them on its
own gradient, so the ranks' copies drift apart and none follows the large batch.

AG179: a hand-written all-reduce iterating over one parameter group
(``for p in opt.param_groups[0]["params"]: dist.all_reduce(p.grad)``) in a file that builds
an optimizer from two or more groups (a list of ``{"params": ...}`` dicts): the other groups
(typically the no-decay biases, norms and embeddings) are never averaged.

AG180: a module of the file's own that holds an ``nn.Parameter`` (a CLIP loss's learnable
temperature, a learned loss weighting) instantiated on its own, never given to the DDP/FSDP
wrapper nor to another module, whose parameters an optimizer steps, in a file that wraps a
model for data parallelism and all-reduces no gradient by hand: the wrapper averages the
gradients of the module it wraps only.
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

__all__ = ["module_outside_the_wrapper", "outside_modules", "reduce_over_one_group",
           "reduces_an_outside_module"]

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


def _stepped_by_optimizer(ctx: FileContext, ref: str) -> ast.Call | None:
    """An optimizer constructor given ``ref``'s parameters (``ref.parameters()``, or a
    parameter of it), directly or through a name assigned in the same function."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        callee = dotted(call.func) or ""
        if last_part(callee).lower() not in OPTIMIZER_CLASSES or not call.args:
            continue
        arg = call.args[0]
        sources: list[ast.AST] = [arg]
        if isinstance(arg, ast.Name):
            scope = ctx.scope_of(call)
            sources += ctx.assigned_in(scope).get(arg.id, [])
        for src in sources:
            for n in walk_all(src):
                d = dotted(n) or ""
                if d.startswith(ref + ".") and d != ref + ".to":
                    return call
    return None


def _given_away(ctx: FileContext, ref: str) -> bool:
    """``ref`` passed bare to a call (a wrapper, another module's constructor, a
    ``prepare``): it may then live inside what the wrapper averages."""
    for call in ctx.of(ast.Call):
        args = [*call.args, *(k.value for k in call.keywords)]
        if any(dotted(a) == ref for a in args):
            return True
    return False


def _reduces_by_hand(ctx: FileContext) -> bool:
    for call in ctx.of(ast.Call):
        if call_attr(call) in _REDUCERS and call.args and ".grad" in ast.unparse(call.args[0]):
            return True
        if call_attr(call) in _REDUCERS and call.args \
                and "grad" in (last_part(dotted(call.args[0])) or "").lower():
            return True
    return False


def outside_modules(ctx: FileContext) -> list[tuple[str, str, ast.Call]]:
    """(reference, class, optimizer call) of each module of the file's own classes holding
    an ``nn.Parameter``, instantiated on its own (never given to a wrapper or another call)
    and stepped by an optimizer, in a file that wraps a model for data parallelism."""
    def compute() -> list[tuple[str, str, ast.Call]]:
        wrappers = [c for c in ctx.of(ast.Call) if call_attr(c) in DDP_WRAPPERS]
        classes = _param_classes(ctx) if wrappers else set()
        out = []
        for node in ctx.of(ast.Assign) if classes else []:
            if not (isinstance(node.value, ast.Call) and len(node.targets) == 1):
                continue
            cls = (dotted(node.value.func) or "").rsplit(".", 1)[-1]
            ref = dotted(node.targets[0])
            if cls not in classes or ref is None or _given_away(ctx, ref) \
                    or any(_mentions(w, ref) for w in wrappers):
                continue
            opt = _stepped_by_optimizer(ctx, ref)
            if opt is not None:
                out.append((ref, cls, opt))
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
    if _reduces_by_hand(ctx):
        return
    for ref, cls, opt in outside_modules(ctx):
        yield ctx.finding(
            "AG180",
            opt,
            f"`{ref}` (a `{cls}`, which holds an nn.Parameter) is stepped by this optimizer "
            "but is not inside the module the data-parallel wrapper holds, and the script "
            "all-reduces no gradient itself: the wrapper averages its own module's gradients "
            f"only, so each rank steps `{ref}`'s parameters on its own gradient",
        )
        return
