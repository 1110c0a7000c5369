"""Clipping in a framework hook that runs on every micro-batch (F8): AG138.

Lightning calls ``on_after_backward`` / ``on_before_backward`` on every batch; with
``accumulate_grad_batches`` = K > 1 the optimizer steps once per K batches, so a
``clip_grad_norm_`` (or ``self.clip_gradients``) there clips the partial sum of the window
after each micro-batch, not the window's gradient once. ``configure_gradient_clipping``,
``on_before_optimizer_step`` and ``Trainer(gradient_clip_val=...)`` run once per optimizer
step and are right. A boundary test around the call is respected; a module that steps its
own optimizers (``automatic_optimization = False``) is not judged.

The Hugging Face Trainer calls ``TrainerCallback.on_substep_end`` after every micro-batch of
a window but its last (with ``gradient_accumulation_steps`` > 1): a clip there clips the
window's partial sum, K - 1 times per step. A clip whose ``max_norm`` is infinite only reads
the norm and is not reported.

AG138 also: a gradient hook on the parameters (``p.register_hook(fn)``, or
``p.register_post_accumulate_grad_hook(fn)``) whose function clamps or norm-clips the gradient,
in a file that accumulates (a hand window, the Trainer's or Lightning's K > 1): autograd runs
it on every micro-batch's backward, so each micro-batch's gradient (or the partial sum) is
clipped, not the window's gradient once.

AG319: ``TrainerCallback.on_step_begin`` runs at the start of each window, before its first
backward, on gradients the Trainer cleared after the previous step: a clip there clips
nothing, and the window's gradient reaches the optimizer unclipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import CLIP_FUNCS, FUNCS, call_attr
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import lightning_accumulates, manual_optimization

__all__ = ["clip_before_the_window_in_hf_hook", "clip_in_backward_hook", "reads_only"]

_BACKWARD_HOOKS = ("on_after_backward", "on_before_backward")


@rule("AG138")
def clip_in_backward_hook(ctx: FileContext) -> Iterator[Finding]:
    hooks = [f for f in ctx.of(*FUNCS) if f.name in _BACKWARD_HOOKS]
    if not hooks or not lightning_accumulates(ctx):
        return
    for func in hooks:
        cls = ctx.enclosing(func, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef) or manual_optimization(cls):
            continue
        for n in ctx.local_nodes(func):
            if not (isinstance(n, ast.Call) and call_attr(n) in CLIP_FUNCS) or ctx.guarded(n, func):
                continue
            yield ctx.finding(
                "AG138",
                n,
                f"`{ast.unparse(n.func)}` in `{func.name}`: Lightning calls it on every batch, and "
                "accumulate_grad_batches > 1 makes K batches one optimizer step, so each micro-batch "
                "clips the partial sum of the window instead of the window's gradient once",
            )


def reads_only(call: ast.Call) -> bool:
    """``clip_grad_norm_(params, float("inf"))`` (or ``math.inf``): a norm read, no clip."""
    norm = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "max_norm"), None)
    if norm is None:
        return False
    text = ast.unparse(norm).replace(" ", "").lower()
    return text in ("float('inf')", 'float("inf")', "math.inf", "torch.inf", "np.inf", "numpy.inf")


def _acting_clips(ctx: FileContext, fn: ast.AST, depth: int = 1) -> Iterator[ast.Call]:
    """The clipping calls in ``fn`` that change the gradient (not a norm read with
    max_norm=inf) and are not under a condition; a call of a function of the file that
    makes one (``self._clip(model)``, ``depth`` levels down) is given as that call."""
    for n in ctx.local_nodes(fn):
        if not isinstance(n, ast.Call) or ctx.guarded(n, fn):
            continue
        if call_attr(n) in CLIP_FUNCS:
            if not reads_only(n):
                yield n
        elif depth > 0 and (callee := ctx.callee_of(n)) is not None and callee is not fn \
                and next(_acting_clips(ctx, callee, depth - 1), None) is not None:
            yield n


def _clip_name(call: ast.Call) -> str:
    """The clip's call as the finding names it (a function of the file that clips, said so)."""
    name = f"`{ast.unparse(call.func)}`"
    return name if call_attr(call) in CLIP_FUNCS else f"{name} (a function of the file that clips)"


def _hf_trainer_clip(f: Finding, ga: int | None) -> Finding:
    """An error where the Trainer's GA is in sight; a warning when it is not."""
    return f if ga is not None else replace(f, severity=Severity.WARNING,
                                            confidence=Confidence.MEDIUM)


@rule("AG138")
def clip_in_hf_substep_hook(ctx: FileContext) -> Iterator[Finding]:
    ga, how = ctx.trainer_ga()
    if ga == 1:
        return
    for func in ctx.of(*FUNCS):
        if func.name != "on_substep_end":
            continue
        for n in _acting_clips(ctx, func):
            yield _hf_trainer_clip(ctx.finding(
                "AG138",
                n,
                f"{_clip_name(n)} in `on_substep_end`: the Hugging Face Trainer calls it "
                "after every micro-batch of a window but the last"
                + (f" ({how})" if ga is not None else "")
                + ", so the window's partial sum is clipped after each of its first K - 1 "
                "micro-batches instead of the window's gradient once",
                fix="clip once per optimizer step: TrainingArguments(max_grad_norm=...), or in "
                    "on_pre_optimizer_step; to only read the norm, pass max_norm=float('inf')",
            ), ga)


@rule("AG138")
def clip_in_hf_training_step(ctx: FileContext) -> Iterator[Finding]:
    """A ``training_step`` override of a Hugging Face Trainer subclass clipping the gradient:
    the Trainer runs ``training_step`` (forward, backward) on every micro-batch, and clips
    by ``max_grad_norm`` itself once per optimizer step."""
    ga, how = ctx.trainer_ga()
    if ga == 1:
        return
    for cls in ctx.trainer_classes():
        for fn in cls.body:
            if not isinstance(fn, FUNCS) or fn.name != "training_step":
                continue
            for n in _acting_clips(ctx, fn):
                yield _hf_trainer_clip(ctx.finding(
                    "AG138",
                    n,
                    f"{_clip_name(n)} in `{cls.name}.training_step`: the Hugging Face "
                    "Trainer runs training_step (forward and backward) on every micro-batch"
                    + (f" ({how})" if ga is not None else "")
                    + ", so the window's partial sum is clipped after each micro-batch instead "
                    "of the window's gradient once",
                    fix="clip once per optimizer step: TrainingArguments(max_grad_norm=...) (the "
                        "Trainer clips at the window's end), or in a callback's "
                        "on_pre_optimizer_step",
                ), ga)


_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_max", "nan_to_num",
                     "clip_grad_value_", "clip_grad_norm_"})


def _clamping_hook(ctx: FileContext, fn: ast.AST) -> ast.AST | None:
    """The clip a gradient hook applies (a lambda or a function of the file): its clamp call,
    or the rescale by the gradient's own norm (``n = p.grad.norm()`` then
    ``p.grad.mul_(c / n)``)."""
    body: ast.AST | None = fn
    if isinstance(fn, ast.Name | ast.Attribute):
        name = fn.id if isinstance(fn, ast.Name) else fn.attr
        defs = ctx.functions_by_name().get(name, [])
        body = defs[0] if len(defs) == 1 else None
    if not isinstance(body, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    found = _clips_in(body)
    if found is not None:
        return found
    for c in ast.walk(body):  # a function of the file the hook calls (`adaptive_clip_(t, c)`)
        defs = ctx.functions_by_name().get(call_attr(c) or "", []) if isinstance(c, ast.Call) else []
        if len(defs) == 1 and defs[0] is not body and _clips_in(defs[0]) is not None:
            return c  # (named by its call: the function of the file that clips)
    return None


def _clips_in(body: ast.AST) -> ast.AST | None:
    """The rescale of the gradient by its own norm in ``body`` (``g.mul_(c / g.norm())``),
    else a clamp call."""
    calls = [c for c in ast.walk(body) if isinstance(c, ast.Call)]
    if any(call_attr(c) in ("norm", "vector_norm") for c in calls):
        scaled = next((c for c in calls if call_attr(c) in ("mul_", "div_")), None) or next(
            (b for b in ast.walk(body) if isinstance(b, ast.BinOp)
             and isinstance(b.op, ast.Mult | ast.Div)), None)
        if scaled is not None:
            return scaled
    return next((c for c in calls if (call_attr(c) or "") in _CLAMPS), None)


def _over_parameters(ctx: FileContext, tensor: ast.AST | None) -> bool:
    """``p`` of ``for p in model.parameters()`` (or ``named_parameters()``)."""
    if not isinstance(tensor, ast.Name):
        return False
    loop = ctx.enclosing(tensor, (ast.For,))
    while isinstance(loop, ast.For):
        names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        if tensor.id in names:
            return any(isinstance(c, ast.Call) and call_attr(c) in ("parameters", "named_parameters")
                       for c in ast.walk(loop.iter))
        loop = ctx.enclosing(loop, (ast.For,))
    return False


def _accumulation(ctx: FileContext) -> str | None:
    """How the file accumulates (a hand window, the Trainer's GA > 1, Lightning's K > 1), in
    words for the finding, else None."""
    for w in ctx.windows():
        if ctx.window_facts(w).accumulating:
            return None if ctx.window_k_is_one(w) else "the file accumulates gradients"
    ga, how = ctx.trainer_ga()
    if ga is not None and ga > 1:
        return f"the Trainer accumulates ({how})"
    if lightning_accumulates(ctx):
        return "Lightning accumulates (accumulate_grad_batches > 1)"
    return None


_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")


@rule("AG138")
def clamp_in_parameter_grad_hook(ctx: FileContext) -> Iterator[Finding]:
    """``p.register_hook(lambda g: g.clamp(-c, c))`` over the model's parameters while the
    file accumulates (a hand window, the Trainer's or Lightning's K > 1): a tensor hook sees
    each backward's own gradient, so every micro-batch's contribution is clipped on its own,
    before it is added to ``.grad``, instead of the window's sum once (clipping by value is
    not linear). ``register_post_accumulate_grad_hook`` with a clamp or a rescale by the
    gradient's norm clips the window's partial sum after every micro-batch."""
    regs = [c for c in ctx.of(ast.Call) if call_attr(c) in _HOOKS and c.args
            and isinstance(c.func, ast.Attribute)]
    how = _accumulation(ctx) if regs else None
    if how is None:
        return
    for call in regs:
        assert isinstance(call.func, ast.Attribute)
        clamp = _clamping_hook(ctx, call.args[0])
        if clamp is None or not _over_parameters(ctx, call.func.value) or _never_called(ctx, call):
            continue
        after = call_attr(call) == "register_post_accumulate_grad_hook"
        yield ctx.finding(
            "AG138",
            call,
            f"`{ast.unparse(call)}` clips each parameter's gradient in a "
            + ("post-accumulate-grad hook" if after else "tensor hook")
            + f" (`{ast.unparse(clamp)}`), which runs on every backward, and {how}: "
            + ("after every micro-batch the window's partial sum in .grad is clipped"
               if after else "each micro-batch's contribution is clipped on its own before it "
               "is added to .grad")
            + ", not the window's gradient once",
            fix="clip once per optimizer step, on the accumulated gradient "
                "(torch.nn.utils.clip_grad_value_ / clip_grad_norm_ right before the step; the "
                "Trainer: max_grad_norm, or a callback's on_pre_optimizer_step; Lightning: "
                "gradient_clip_val)",
        )


def _never_called(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` sits in a function of the file that nothing in the file calls (a helper kept
    after its call was removed); a hook a framework calls (``on_fit_start`` of a
    ``LightningModule`` or a callback, ``setup``) and ``__init__`` count as called."""
    fn = ctx.enclosing(node, FUNCS)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    cls = ctx.enclosing(fn, (ast.ClassDef,))
    if fn.name == "__init__" or (isinstance(cls, ast.ClassDef) and cls.bases and (
            fn.name.startswith("on_") or fn.name in ("setup", "configure_model"))):
        return False
    return not any((isinstance(c.func, ast.Name) and c.func.id == fn.name)
                   or (isinstance(c.func, ast.Attribute) and c.func.attr == fn.name)
                   for c in ctx.of(ast.Call))


@rule("AG319")
def clip_before_the_window_in_hf_hook(ctx: FileContext) -> Iterator[Finding]:
    for func in ctx.of(*FUNCS):
        if func.name != "on_step_begin" or not isinstance(
                cls := ctx.enclosing(func, (ast.ClassDef,)), ast.ClassDef) or not any(
                "Callback" in (ast.unparse(b)) for b in cls.bases):
            continue
        for n in _acting_clips(ctx, func):
            yield ctx.finding(
                "AG319",
                n,
                f"{_clip_name(n)} in `{cls.name}.on_step_begin`: the Hugging Face Trainer calls "
                "it at the start of each optimizer step's window, before its first backward, "
                "on gradients it cleared after the previous step, so it clips nothing and the "
                "window's gradient reaches the optimizer unclipped")
