"""Where a DDP sync-flag setting stands against the forward it should precede (for
:mod:`.sync`, AG106/AG116): a forward of the module earlier in the same micro-step (inline,
in a loss helper given the module, or before the call of the helper that sets the flag),
a flag that is a parameter read at its one call site, and calls of a setter helper read as
settings at the call."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import LOOPS, SCOPES, dotted, is_backward, position, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint.families._modguard import exclusive

__all__ = ["forward_before", "forward_inside", "hands_to_forward", "is_forward_of", "setter_calls",
           "through_parameter"]

_FN = (ast.FunctionDef, ast.AsyncFunctionDef)


def is_forward_of(call: ast.Call, recv: str) -> bool:
    name = dotted(call.func)
    return name is not None and name in (recv, recv + ".forward")


def forward_inside(node: ast.AST, recv: str) -> bool:
    return any(isinstance(n, ast.Call) and is_forward_of(n, recv) for n in walk_local(node))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]


def hands_to_forward(ctx: FileContext, call: ast.Call, recv: str) -> bool:
    """``token_loss_sum(model, x, y)``: a function of the file given the module calls the
    parameter it binds (the forward runs there)."""
    callee = ctx.callee_of(call)
    if not isinstance(callee, _FN):
        return False
    return any(dotted(bound_argument(callee, call, p)) == recv and forward_inside(callee, p)
               for p in _params(callee) if bound_argument(callee, call, p) is not None)


def forward_before(ctx: FileContext, node: ast.stmt, recv: str, *, helpers: bool = False
                   ) -> ast.Call | None:
    """A forward call of ``recv`` earlier in the same loop iteration, feeding a later backward
    (also when ``node`` sits in a backward helper the loop calls after a helper that runs
    the forward: ``loss = self._compute_loss(b)`` then ``self._backward(loss, micro)``).
    With ``helpers``, a call handing ``recv`` to a loss helper that runs it counts too (not
    in another branch of an ``if``)."""
    loop = ctx.enclosing(node, LOOPS + SCOPES)
    if not isinstance(loop, LOOPS):
        return _forward_before_helper(ctx, node, recv)
    header = set(walk_local(loop.iter if isinstance(loop, ast.For | ast.AsyncFor) else loop.test))
    if not any(
        isinstance(b, ast.Call) and is_backward(b) and b.lineno >= node.lineno for b in walk_local(loop)
    ):
        return None
    for n in walk_local(loop):
        if (
            isinstance(n, ast.Call)
            and n not in header
            and (is_forward_of(n, recv) or (helpers and hands_to_forward(ctx, n, recv)
                                                and not exclusive(ctx, n, node)))
            and (n.lineno, n.col_offset) < (node.lineno, node.col_offset)
        ):
            return n
    return None


def _forward_before_helper(ctx: FileContext, node: ast.stmt, recv: str) -> ast.Call | None:
    """``node`` in a function (no loop around it there) that runs a backward after it; the
    function is called in a loop after a forward of ``recv`` in the same iteration, inline or
    in a function of the file called there before it; or the function itself runs the
    forward before ``node`` (``loss = summed_ce(ddp_model, batch)`` then the flag)."""
    fn = ctx.enclosing(node, SCOPES)
    if not isinstance(fn, _FN) or not any(
            isinstance(b, ast.Call) and is_backward(b) and position(b) > position(node)
            for b in walk_local(fn)):
        return None
    for n in walk_local(fn):
        if isinstance(n, ast.Call) and position(n) < position(node) and (
                is_forward_of(n, recv) or hands_to_forward(ctx, n, recv)):
            return n
    for site in ctx.call_sites(fn):
        loop = ctx.enclosing(site, LOOPS + SCOPES)
        if not isinstance(loop, LOOPS):
            continue
        for n in walk_local(loop):
            if not (isinstance(n, ast.Call) and position(n) < position(site)):
                continue
            if is_forward_of(n, recv):
                return n
            callee = ctx.callee_of(n)
            if callee is not None and callee is not fn and forward_inside(callee, recv):
                return n
    return None


def through_parameter(ctx: FileContext, node: ast.AST, value: ast.AST) -> ast.AST:
    """A flag that is a parameter of the function around ``node`` (never reassigned there),
    read as the argument its one call site of the file gives it (``micro_step(ddp, b, scale,
    i == K - 1)``)."""
    fn = ctx.enclosing(node, SCOPES)
    if not (isinstance(value, ast.Name) and isinstance(fn, _FN)) or value.id not in _params(fn) \
            or value.id in ctx.assigned_in(fn):
        return value
    sites = ctx.call_sites(fn)
    arg = bound_argument(fn, sites[0], value.id) if len(sites) == 1 else None
    return arg if arg is not None else value


def setter_calls(ctx: FileContext) -> list[tuple[ast.stmt, str, ast.AST]]:
    """Calls of a setter helper (``def set_sync(model, flag): model.require_backward_grad_sync
    = flag``, no backward in it), each as a setting at the call's statement: (the call's
    statement, the module it is given, the value it is given)."""
    out: list[tuple[ast.stmt, str, ast.AST]] = []
    for fn in ctx.of(ast.FunctionDef):
        params = _params(fn)
        sets = [(t.value.id, n.value.id) for n in walk_local(fn) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)
                and t.attr == "require_backward_grad_sync" and isinstance(t.value, ast.Name)
                and isinstance(n.value, ast.Name) and t.value.id in params and n.value.id in params]
        if len(sets) != 1 or any(isinstance(c, ast.Call) and is_backward(c) for c in walk_local(fn)):
            continue
        module_param, flag_param = sets[0]
        for site in ctx.call_sites(fn):
            module = bound_argument(fn, site, module_param)
            flag = bound_argument(fn, site, flag_param)
            stmt = ctx.parents.get(site)
            if module is None or flag is None or (name := dotted(module)) is None \
                    or not isinstance(stmt, ast.Expr):
                continue
            out.append((stmt, name, flag))
    return out
