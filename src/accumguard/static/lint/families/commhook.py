"""A DDP communication hook of the script's own that sums the bucket over the ranks and never
divides it (F10): AG159; or divides it by the world size and then all-reduces with AVG, an
average taken twice (F10): AG184.

``DistributedDataParallel.register_comm_hook(state, hook)`` replaces DDP's own reduction:
whatever tensor the hook's future returns is written into every parameter's ``.grad``.
DDP's default, and torch's ``allreduce_hook``, divide the bucket by the process group's
size (the ranks' average, what the large batch's mean needs when each rank's loss is its own
mean); a hook that calls ``all_reduce`` with the default SUM and divides nowhere (not the
bucket before, not the result in its ``then`` callback) hands the optimizer the ranks' sum,
W times the large batch's gradient. Not said when the file divides something by the world
size elsewhere (a loss written for a summing reduction), or when the hook calls a function
of the file that is not read here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import is_mean_call

_REGISTER = "register_comm_hook"
#: calls that scale a tensor (a division by the world size written as one of them)
_SCALES = frozenset({"div_", "div", "mul_", "mul", "true_divide", "true_divide_", "divide"})


def _op(call: ast.Call) -> str:
    op = next((k.value for k in call.keywords if k.arg == "op"),
              call.args[1] if len(call.args) > 1 else None)
    return "sum" if op is None else (last_part(dotted(op)) or "?").lower()


def _scales(ctx: FileContext, nodes: list[ast.AST]) -> bool:
    """Anything in the hook that divides (by the world size or not: any division may be the
    average, so the rule stays silent), or multiplies by a fraction or the world size (a
    product of sizes, bytes counted for a log, is no rescaling)."""
    for n in nodes:
        if isinstance(n, ast.Call) and (call_attr(n) or "") in _SCALES:
            return True
        if isinstance(n, ast.BinOp | ast.AugAssign) and isinstance(n.op, ast.Div):
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and any(
                (isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div)) or ctx.mentions_world(x)
                for x in (n.left, n.right)):
            return True
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Mult) \
                and not isinstance(n.target, ast.Subscript):
            return True
    return False


def _file_divides_by_world(ctx: FileContext) -> bool:
    for n in ctx.of(ast.BinOp):
        if isinstance(n.op, ast.Div) and ctx.mentions_world(n.right):
            return True
    for n in ctx.of(ast.AugAssign):
        if isinstance(n.op, ast.Div) and ctx.mentions_world(n.value):
            return True
    return any((call_attr(c) or "") in _SCALES and c.args and ctx.mentions_world(c.args[0])
               for c in ctx.of(ast.Call))


def _loss_expr(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """What ``<loss>.backward()`` backpropagates: the receiver, or the value last assigned to
    its name before the call in the same function."""
    if not isinstance(call.func, ast.Attribute):
        return None
    recv = call.func.value
    if not isinstance(recv, ast.Name):
        return recv
    scope = ctx.scope_of(call)
    assigns = [a for a in ctx.local_nodes(scope)
               if isinstance(a, ast.Assign) and a.lineno <= call.lineno
               and any(isinstance(t, ast.Name) and t.id == recv.id for t in a.targets)]
    return max(assigns, key=lambda a: a.lineno).value if assigns else None


def _rank_means(ctx: FileContext) -> bool:
    """Every backward of the file's accumulation windows takes a mean loss call divided by
    K at most (each rank's own mean), and there is at least one."""
    seen = 0
    for window in ctx.windows():
        if not ctx.window_facts(window).accumulating:
            continue
        for n in walk_all(window):
            if not (isinstance(n, ast.Call) and call_attr(n) == "backward" and not n.args):
                continue
            expr = _loss_expr(ctx, n)
            if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) \
                    and _rank_sample_count(ctx, expr.right):
                seen += 1  # `loss_sum / (micro_bs * K)`: this rank's own samples
                continue
            while isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) \
                    and ctx.mentions_accum(expr.right):
                expr = expr.left
            if expr is None or not is_mean_call(expr):
                return False
            seen += 1
    return seen > 0


def _rank_sample_count(ctx: FileContext, divisor: ast.AST) -> bool:
    """``micro_bs * K`` (a product of the micro-batch size and the accumulation steps, no
    world size): the samples of one rank's window, a per-rank mean's divisor."""
    if not (isinstance(divisor, ast.BinOp) and isinstance(divisor.op, ast.Mult)) \
            or ctx.mentions_world(divisor):
        return False
    sides = (divisor.left, divisor.right)
    return any(ctx.mentions_accum(a) for a in sides) and any(
        re.search(r"(^|_)(micro_)?(bs|batch(_size)?)$", (last_part(dotted(b) or "")).lower())
        for b in sides if not ctx.mentions_accum(b))


def _hooks(ctx: FileContext
           ) -> Iterator[tuple[ast.Call, ast.FunctionDef | ast.AsyncFunctionDef, list[ast.AST],
                               list[ast.Call]]]:
    """Each ``register_comm_hook`` call whose hook is a function of the file: the call, the
    function, its nodes and its ``all_reduce`` calls."""
    for reg in (c for c in ctx.of(ast.Call) if call_attr(c) == _REGISTER):
        fn = ctx.function_named(next((k.value for k in reg.keywords if k.arg == "hook"),
                                     reg.args[1] if len(reg.args) > 1 else None), reg)
        if fn is None:
            continue
        body = list(walk_all(fn))
        yield reg, fn, body, [n for n in body if isinstance(n, ast.Call)
                              and call_attr(n) == "all_reduce"]


@rule("AG159")
def comm_hook_sums_without_average(ctx: FileContext) -> Iterator[Finding]:
    own = {name for name in ctx.defs_by_name()}
    for reg, fn, body, reduces in _hooks(ctx):
        if len(reduces) != 1 or _op(reduces[0]) != "sum" or _scales(ctx, body):
            continue
        called = {(dotted(n.func) or "").rsplit(".", 1)[-1] for n in body if isinstance(n, ast.Call)}
        if (called - {fn.name}) & own or _file_divides_by_world(ctx) or not _rank_means(ctx):
            continue  # a helper of the file may divide; a loss may be written for a sum
        red = reduces[0]
        yield ctx.finding(
            "AG159",
            red,
            f"the DDP communication hook `{fn.name}` (registered at line {reg.lineno}) reduces "
            f"the bucket with `{ast.unparse(red)}`, a SUM over the ranks, and divides it "
            "nowhere: DDP writes what the hook returns into .grad, so the optimizer receives "
            "the sum of the ranks' gradients, W times the average DDP's own reduction gives",
        )


def _world_division(ctx: FileContext, nodes: list[ast.AST]) -> ast.AST | None:
    """A division of the bucket by the world size in the hook (``buf.div_(world)``,
    ``t / dist.get_world_size()``)."""
    for n in nodes:
        if isinstance(n, ast.Call) and call_attr(n) in ("div_", "div", "true_divide", "divide") \
                and n.args and ctx.mentions_world(n.args[0]):
            return n
        if isinstance(n, ast.BinOp | ast.AugAssign) and isinstance(n.op, ast.Div) \
                and ctx.mentions_world(n.right if isinstance(n, ast.BinOp) else n.value):
            return n
    return None


@rule("AG184")
def comm_hook_averages_twice(ctx: FileContext) -> Iterator[Finding]:
    """AG184 (F10): a DDP communication hook that divides the bucket by the world size and
    then reduces it with ``ReduceOp.AVG``, which divides by the world size again: the
    optimizer receives 1/W of the ranks' average."""
    for reg, fn, body, reduces in _hooks(ctx):
        div = _world_division(ctx, body)
        if len(reduces) != 1 or _op(reduces[0]) != "avg" or div is None:
            continue
        yield ctx.finding(
            "AG184",
            reduces[0],
            f"the DDP communication hook `{fn.name}` (registered at line {reg.lineno}) divides "
            f"the bucket by the world size (`{ast.unparse(div)}`, line {getattr(div, 'lineno', '?')}) and then "
            f"reduces it with `{ast.unparse(reduces[0])}`, an AVG that divides by the world "
            "size again: the optimizer receives 1/W of the ranks' average gradient",
        )
