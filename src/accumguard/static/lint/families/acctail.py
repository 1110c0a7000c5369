"""AG157 (F7): Accelerate steps a pass's short last window with its loss still divided by K.

Inside ``accelerator.accumulate(model)``, Accelerate (1.x, ``sync_with_dataloader`` on by
default) syncs and lets the prepared optimizer step on the last batch of a pass over a
prepared loader whatever the window holds, while ``accelerator.backward`` divides every
loss by ``gradient_accumulation_steps`` = K. A pass of n batches per process with
n % K = r != 0 ends in a window of r micro-batches that reaches the optimizer as r/K of its
mean gradient (the large batch of that window is the mean over its own samples).

Reported when the Accelerator's K, the loader's length (a ``DataLoader`` over data sized
with constants) and the loop over the prepared loader are all in sight, and nothing
rescales the loss given to ``backward`` (a factor read from the loader's length, the
window's position or count undoes the division for the short window). The number of
processes is the launcher's, not the file's: each process takes ceil(n / W) batches
(Accelerate's ``even_batches``), so the finding names the process counts among 1 and 2
that leave a short window; a warning.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._lengths import static_len
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import k_values

__all__ = ["accelerate_short_last_window"]

#: Accelerator settings under which the pass's last window is not (or not only) what the
#: rule reads: a plugin or a DeepSpeed/Megatron plugin deciding accumulation, a dataloader
#: configuration (``even_batches=False``, no sync with the loader)
_OWN_SETTINGS = frozenset({"gradient_accumulation_plugin", "deepspeed_plugin", "deepspeed_plugins",
                           "megatron_lm_plugin", "dataloader_config", "dispatch_batches",
                           "even_batches"})
_WORLDS = (1, 2)


def _accelerators(ctx: FileContext) -> list[tuple[ast.Call, int, bool]]:
    """``Accelerator(...)`` calls with one K > 1 in sight: (call, K, split_batches)."""
    out = []
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "Accelerator":
            continue
        kws = {kw.arg: kw.value for kw in call.keywords}
        if None in kws or _OWN_SETTINGS & set(kws) or "gradient_accumulation_steps" not in kws:
            continue
        ks = k_values(ctx, kws["gradient_accumulation_steps"], call)
        if ks == {None}:  # `K = CFG["grad_accum"]` then `gradient_accumulation_steps=K`
            ks = {ctx.int_through_names(kws["gradient_accumulation_steps"])}
        split = kws.get("split_batches")
        if split is not None and not (isinstance(split, ast.Constant) and split.value in (True, False)):
            continue
        if len(ks) == 1 and isinstance(k := next(iter(ks)), int) and k > 1:
            out.append((call, k, bool(split.value) if isinstance(split, ast.Constant) else False))
    return out


def _prepared_loader(ctx: FileContext, loop: ast.For) -> ast.AST | None:
    """The loader expression handed to ``accelerator.prepare`` that the loop iterates
    (``model, opt, dl = accelerator.prepare(model, opt, dl)`` then ``for b in dl``)."""
    it = loop.iter
    while isinstance(it, ast.Call) and call_attr(it) in ("enumerate", "tqdm") and it.args:
        it = it.args[0]
    if not isinstance(it, ast.Name):
        return None
    scope = ctx.scope_of(loop)
    write = ctx.reaching_write(scope, it.id, it)
    if not isinstance(write, ast.Assign) or len(write.targets) != 1:
        return None
    target, value = write.targets[0], write.value
    if not (isinstance(value, ast.Call) and call_attr(value) == "prepare"
            and ctx.is_accelerator(receiver(value))):
        return None
    if isinstance(target, ast.Name):
        arg = value.args[0] if len(value.args) == 1 else None
    elif isinstance(target, ast.Tuple | ast.List) and len(target.elts) == len(value.args):
        at = [i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == it.id]
        arg = value.args[at[0]] if len(at) == 1 else None
    else:
        return None
    if isinstance(arg, ast.Name):
        before = ctx.reaching_write(scope, arg.id, value)
        return before.value if isinstance(before, ast.Assign) and len(before.targets) == 1 \
            and isinstance(before.targets[0], ast.Name) else None
    return arg


def _bare_arithmetic(expr: ast.AST) -> Iterator[ast.BinOp]:
    """The products and quotients of ``expr`` outside any call's arguments (the loss's own
    scaling, not the arithmetic that computes it)."""
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.BinOp):
            yield node
        if not isinstance(node, ast.Call):
            todo.extend(ast.iter_child_nodes(node))


def _rescaled(ctx: FileContext, loop: ast.For, call: ast.Call) -> bool:
    """The loss given to ``backward`` may carry a window-dependent factor: a product or
    quotient by anything but a literal, in the argument or in the loss's assignment in the
    loop; or the loop reads the loader's length or Accelerate's end-of-pass state."""
    for node in walk_all(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("end_of_dataloader", "remainder",
                                                             "gradient_state"):
            return True
        if isinstance(node, ast.Break | ast.Return):
            return True  # a pass that may end before its last window
    exprs: list[ast.AST] = [call.args[0]]
    for name in {n.id for n in walk_all(call.args[0]) if isinstance(n, ast.Name)}:
        for write in (n for n in walk_all(loop) if isinstance(n, ast.Assign | ast.AugAssign)):
            targets = write.targets if isinstance(write, ast.Assign) else [write.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if isinstance(write, ast.AugAssign):
                    return True
                exprs.append(write.value)
    for expr in exprs:
        for op in _bare_arithmetic(expr):
            if isinstance(op.op, ast.Mult | ast.Div) and not all(
                    isinstance(side, ast.Constant) or _is_loss_part(side)
                    for side in (op.left, op.right)):
                return True
    return False


def _is_loss_part(side: ast.AST) -> bool:
    """A side of a product that is the loss itself (a call or the loss name), not a factor."""
    return isinstance(side, ast.Call)


@rule("AG157")
def accelerate_short_last_window(ctx: FileContext) -> Iterator[Finding]:
    accelerators = _accelerators(ctx)
    if len(accelerators) != 1 or not ctx.is_training_script():
        return
    _, k, split = accelerators[0]
    for loop in ctx.of(ast.For):
        accumulates = [w for w in walk_all(loop) if isinstance(w, ast.With) and any(
            isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
            and ctx.is_accelerator(receiver(i.context_expr)) for i in w.items)]
        if not accumulates:
            continue
        backwards = [c for c in walk_all(accumulates[0]) if isinstance(c, ast.Call)
                     and call_attr(c) == "backward" and c.args and ctx.is_accelerator(receiver(c))]
        if len(backwards) != 1 or _rescaled(ctx, loop, backwards[0]):
            continue
        n = static_len(ctx, _prepared_loader(ctx, loop))
        if n is None or n < 1:
            continue
        short = {w: per % k for w in _WORLDS if (per := n if split else -(-n // w)) % k}
        if not short:
            continue
        where = f"on every process (split_batches), the last window {n % k} of {k}" if split \
            else "; ".join(f"{-(-n // w)} per process on {w} process{'es' if w > 1 else ''}, "
                           f"the last window {r} of {k}" for w, r in short.items())
        yield ctx.finding(
            "AG157",
            backwards[0],
            f"a pass over the prepared loader is {n} batches ({where}): accumulate() steps "
            f"that short window at the end of the pass, and `{ast.unparse(backwards[0])}` "
            f"still divides its loss by gradient_accumulation_steps = {k}, so its r "
            f"micro-batches reach the optimizer as r/{k} of their mean gradient",
        )
