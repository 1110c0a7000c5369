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

AG117 (F7) in the same shape: the step gated by ``(batch_idx + 1) % K == 0`` alone, the
module never reading where the epoch ends (``is_last_batch``, ``num_training_batches``):
``batch_idx`` starts again at 0 in every epoch, and in manual optimisation nothing clears
the gradient between epochs, so an epoch of n batches with n % K = r leaves r batches' gradient
in ``.grad`` that the next epoch's first window adds to its own K. An error when the Trainer
runs two epochs or more and the epoch's length is in sight; not reported when it is not (the
pattern of Lightning's documentation, right when every epoch is whole windows).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
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
from accumguard.static.lint.families._modguard import k_values, mod_guard
from accumguard.static.lint.families.epochtail import fit_batches

__all__ = ["lightning_manual_batch_idx_off_by_one", "lightning_manual_clip_every_batch",
           "lightning_manual_epoch_tail"]


def _manual_training_steps(ctx: FileContext) -> Iterator[tuple[ast.FunctionDef, ast.ClassDef, str]]:
    """Each ``training_step(self, batch, batch_idx)`` of a module in manual optimisation, with
    its class and the name of its ``batch_idx`` parameter."""
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or len(fn.args.args) < 3:
            continue
        cls = ctx.enclosing(fn, (ast.ClassDef,))
        if isinstance(cls, ast.ClassDef) and manual_optimization(cls):
            yield fn, cls, fn.args.args[2].arg  # (self, batch, batch_idx)


@rule("AG115")
def lightning_manual_batch_idx_off_by_one(ctx: FileContext) -> Iterator[Finding]:
    for fn, _, batch_idx in _manual_training_steps(ctx):
        backwards = [c for c in walk_local(fn) if isinstance(c, ast.Call)
                     and call_attr(c) in ("manual_backward", "backward")]
        for node in _gated_steps(ctx, fn, batch_idx):
            guard = mod_guard(node.test)
            if (guard is None or guard.offset != 0 or guard.residue or guard.excludes_zero):
                continue
            if not any(position(b) < position(node) for b in backwards):
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
    for fn, cls, batch_idx in _manual_training_steps(ctx):
        gates = _gated_steps(ctx, fn, batch_idx)
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


def _epochs(ctx: FileContext) -> list[tuple[ast.Call, int]]:
    """The file's ``Trainer(...)`` calls with ``max_epochs`` of two or more in sight; a Trainer
    of one epoch, or bounded by ``max_steps``, has no next epoch for a tail to leak into in
    sight."""
    out: list[tuple[ast.Call, int]] = []
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "Trainer":
            continue
        kws = {k.arg: k.value for k in call.keywords if k.arg is not None}
        if "max_epochs" not in kws or "max_steps" in kws or "limit_train_batches" in kws:
            continue
        epochs = ctx.int_value(kws["max_epochs"])
        if epochs is not None and epochs >= 2:
            out.append((call, epochs))
    return out


@rule("AG117")
def lightning_manual_epoch_tail(ctx: FileContext) -> Iterator[Finding]:
    trainers = _epochs(ctx)
    if not trainers:
        return
    for fn, cls, batch_idx in _manual_training_steps(ctx):
        if any(isinstance(n, ast.Attribute) and n.attr in ("is_last_batch", "num_training_batches")
               for n in ast.walk(cls)):
            continue  # the module reads where the epoch ends: it may close the tail itself
        for node in _gated_steps(ctx, fn, batch_idx):
            guard = mod_guard(node.test)
            if guard is None or isinstance(node.test, ast.BoolOp) or guard.offset != 1 \
                    or guard.residue or guard.excludes_zero:
                continue
            ks = k_values(ctx, guard.modulus, node)
            if ks == {None}:  # `N = HP["accum"]` in the step: the one integer its values hold
                ks = {ctx.int_through_names(guard.modulus)}
            k = next(iter(ks)) if len(ks) == 1 else None
            if k == 1:
                continue
            lengths = {fit_batches(ctx, t) for t, _ in trainers}
            n = next(iter(lengths)) if len(lengths) == 1 else None
            if n is None or k is None or n % k == 0:
                continue  # (the length not in sight: the docs' pattern, right for whole epochs)
            head = (f"`{ast.unparse(node.test)}` alone gates the optimizer step, `{batch_idx}` starts "
                    "again at 0 in every epoch, and in manual optimisation nothing clears the "
                    "gradient between epochs")
            r = n % k
            yield replace(ctx.finding(
                "AG117", node,
                f"{head}: the epoch's {n} batches leave {r} after the last full window of {k}, "
                "whose gradient stays in .grad and is added to the next epoch's first window "
                f"({k + r} batches in one step)",
                fix="also step on the epoch's last batch (`or self.trainer.is_last_batch`), "
                    "scaling its loss to the short window, or zero the gradient there"),
                severity=Severity.ERROR, confidence=Confidence.HIGH)
            break
