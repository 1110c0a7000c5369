"""A functional loop that clips each micro-step's gradients before summing them (F8): AG312.

A loop written in the functional style (ported from JAX/optax) takes each micro-step's
gradients with ``torch.autograd.grad(loss, params)``, passes them through a clip
(``clip_by_global_norm(grads, max_norm)``, any call whose name says clip) and adds them into
accumulators that the optimizer steps on after the loop. Each micro-batch's gradient is then
clipped on its own, where the large batch clips the window's sum once. No backward runs, so
the window rules of the other families do not see this loop. Not reported in a file that
clips per sample on purpose (DP-SGD: ``vmap``, per-sample gradients, Opacus, a noise
multiplier).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["clip_per_functional_micro_step"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_PER_SAMPLE = ("vmap", "per_sample", "opacus", "noise_multiplier", "privacy", "privateer")


def _local(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes under ``node``, not inside functions defined there."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (*FUNCS, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))


def _grad_names(loop: ast.AST) -> set[str]:
    """Names bound to ``torch.autograd.grad(...)`` in the loop."""
    out: set[str] = set()
    for n in _local(loop):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) \
                and (dotted(n.value.func) or "").endswith("autograd.grad"):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def _clip_of(loop: ast.AST, grads: set[str]) -> ast.Call | None:
    for n in _local(loop):
        if isinstance(n, ast.Call) and "clip" in (call_attr(n) or "").lower() and any(
                isinstance(a, ast.Name) and a.id in grads for a in n.args):
            return n
    return None


def _accumulates(loop: ast.AST) -> bool:
    return any((isinstance(n, ast.Call) and call_attr(n) == "add_")
               or (isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add))
               for n in _local(loop))


def _steps_outside(ctx: FileContext, loop: ast.AST) -> bool:
    """An enclosing loop runs an optimizer ``.step()`` outside ``loop``."""
    inner = set(map(id, _local(loop)))
    cur = ctx.parents.get(loop)
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, _LOOPS):
            return any(isinstance(n, ast.Call) and call_attr(n) == "step" and not n.args
                       and id(n) not in inner for n in _local(cur))
        cur = ctx.parents.get(cur)
    return False


@rule("AG312")
def clip_per_functional_micro_step(ctx: FileContext) -> Iterator[Finding]:
    text = ast.unparse(ctx.tree).lower()
    if "autograd.grad" not in text or any(w in text for w in _PER_SAMPLE):
        return
    for loop in ctx.of(*_LOOPS):
        grads = _grad_names(loop)
        clip = _clip_of(loop, grads) if grads else None
        if clip is None or not _accumulates(loop) or not _steps_outside(ctx, loop):
            continue
        yield ctx.finding(
            "AG312", clip,
            f"`{ast.unparse(clip.func)}(...)` clips each micro-step's gradients from "
            "`torch.autograd.grad` before they are added to the accumulators, and the "
            "optimizer steps after the loop: every micro-batch is clipped on its own, where "
            "the large batch clips the window's summed (and averaged) gradient once")
        return
