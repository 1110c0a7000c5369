"""AG115 (F13) in Lightning's manual optimisation: ``if batch_idx % K == 0:`` steps after
the backward of batch 0.

With ``automatic_optimization = False`` the ``training_step`` accumulates by hand: it calls
``self.manual_backward`` on every batch and steps its optimizers every K batches. Lightning
counts ``batch_idx`` from 0 in every epoch, so a step gated by ``batch_idx % K == 0`` after
the backward fires on the first batch: the first window holds one micro-batch, every later
one is shifted by one, and an epoch's last K - 1 batches are carried into the next epoch.
The right gate is ``(batch_idx + 1) % K == 0``.

AG105 (F8) in the same shape: the ``training_step`` gates its optimizer steps on
``batch_idx % K`` but clips (``self.clip_gradients``, ``clip_grad_norm_``) on every batch,
in its own body or in a method of the module it calls on every batch: each clip acts on a
partial gradient, so the window's sum is made of clipped pieces.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    CLIP_FUNCS,
    call_attr,
    dotted,
    position,
    receiver,
    walk_local,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import manual_optimization
from accumguard.static.lint.families._modguard import mod_guard

__all__ = ["lightning_manual_batch_idx_off_by_one", "lightning_manual_clip_every_batch"]


@rule("AG115")
def lightning_manual_batch_idx_off_by_one(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or len(fn.args.args) < 3:
            continue
        cls = ctx.enclosing(fn, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef) or not manual_optimization(cls):
            continue
        batch_idx = fn.args.args[2].arg  # (self, batch, batch_idx)
        backwards = [c for c in walk_local(fn) if isinstance(c, ast.Call)
                     and call_attr(c) in ("manual_backward", "backward")]
        for node in walk_local(fn):
            if not isinstance(node, ast.If):
                continue
            guard = mod_guard(node.test)
            if (guard is None or guard.counter != batch_idx or guard.offset != 0
                    or guard.residue or guard.excludes_zero):
                continue
            steps = [c for s in node.body for c in walk_local(s)
                     if isinstance(c, ast.Call) and call_attr(c) == "step"
                     and ("opt" in (dotted(receiver(c)) or "").lower()
                          or ctx.kind_of_receiver(receiver(c)) == "optimizer")]
            if not steps or not any(position(b) < position(node) for b in backwards):
                continue
            yield ctx.finding(
                "AG115",
                node,
                f"`{ast.unparse(node.test)}` gates the optimizer step after this batch's "
                f"manual_backward, and Lightning counts `{batch_idx}` from 0 in every epoch: the "
                "first window holds 1 batch, every later one is shifted by one, and an epoch's "
                "last K - 1 batches are carried into the next epoch",
                fix=f"step when `({batch_idx} + 1) % K == 0` (and on the epoch's last batch)",
            )


def _gated_steps(ctx: FileContext, fn: ast.FunctionDef, batch_idx: str) -> list[ast.If]:
    """The ``if`` blocks of ``fn`` gated on ``batch_idx`` modulo something that step an
    optimizer."""
    out = []
    for node in walk_local(fn):
        if isinstance(node, ast.If) and (g := mod_guard(node.test)) is not None and g.counter == batch_idx \
                and any(isinstance(c, ast.Call) and call_attr(c) == "step"
                        and ("opt" in (dotted(receiver(c)) or "").lower()
                             or ctx.kind_of_receiver(receiver(c)) == "optimizer")
                        for s in node.body for c in walk_local(s)):
            out.append(node)
    return out


def _unconditional(ctx: FileContext, node: ast.AST, fn: ast.AST) -> bool:
    """``node`` runs whenever ``fn`` does: under no ``if`` of ``fn``, and after no ``if`` of
    ``fn``'s body that may return."""
    cur = ctx.parents.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, ast.If | ast.IfExp | ast.For | ast.While | ast.Try):
            return False
        cur = ctx.parents.get(cur)
    body = getattr(fn, "body", [])
    top = node
    while ctx.parents.get(top) is not fn and ctx.parents.get(top) is not None:
        top = ctx.parents[top]
    before = body[:body.index(top)] if top in body else []
    return not any(isinstance(s, ast.If) and any(isinstance(r, ast.Return) for r in ast.walk(s))
                   for s in before)


@rule("AG105")
def lightning_manual_clip_every_batch(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or len(fn.args.args) < 3:
            continue
        cls = ctx.enclosing(fn, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef) or not manual_optimization(cls):
            continue
        gates = _gated_steps(ctx, fn, fn.args.args[2].arg)
        if not gates:
            continue
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        clips: list[tuple[ast.Call, ast.Call | None]] = []
        for c in walk_local(fn):
            if not (isinstance(c, ast.Call) and _unconditional(ctx, c, fn)):
                continue
            if call_attr(c) in CLIP_FUNCS:
                clips.append((c, None))
            elif isinstance(c.func, ast.Attribute) and dotted(c.func.value) == "self" \
                    and (helper := methods.get(c.func.attr)) is not None and helper is not fn:
                clips += [(h, c) for h in walk_local(helper) if isinstance(h, ast.Call)
                          and call_attr(h) in CLIP_FUNCS and _unconditional(ctx, h, helper)]
        for clip, via in sorted(clips, key=lambda cv: (cv[0].lineno, cv[0].col_offset))[:1]:
            yield ctx.finding(
                "AG105",
                clip,
                f"`{call_attr(clip)}` runs on every batch"
                + (f" (in `{ast.unparse(via.func)}`, called by training_step at line {via.lineno})"
                   if via is not None else "")
                + f", while the optimizer steps only under `{ast.unparse(gates[0].test)}` (line "
                f"{gates[0].lineno}): each clip acts on a partial gradient; clip once, on the "
                "accumulated gradient, inside that branch before the step",
            )
