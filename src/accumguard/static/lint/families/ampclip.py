"""AMP clipping before unscale (F8): AG135.

With a ``torch.amp.GradScaler`` the backward runs on ``scaler.scale(loss)``, so every
``.grad`` holds S times the gradient (S, the loss scale, starts at 65536). PyTorch's AMP
recipe clips only after ``scaler.unscale_(optimizer)``; a ``clip_grad_norm_`` /
``clip_grad_value_`` before it compares the *scaled* gradient with the threshold, so it
clips at max_norm / S in true units (nearly every step, and hard), and ``scaler.step``
then unscales the clipped gradient: the update is not the large batch's clipped update.

Read: a scaler built in the file (``X = ...GradScaler(...)``, ShardedGradScaler too) whose
``X.scale(...)`` is called, and a ``X.step(...)`` with a clip of ``torch.nn.utils`` before
it in the same function, in no branch exclusive with the step, and no ``X.unscale_(...)``
before the clip in that function. Silent when the file calls ``X.unscale_`` in another
function (a helper may unscale first: the order is not in sight), when the scaler is built
with ``enabled=False`` (``scale()`` then returns the loss unchanged). A warning, not an
error, when ``enabled=`` is an expression the file does not decide (``enabled=use_amp``
with ``use_amp`` from the command line): the clip is wrong exactly when the scaler is on.
Clips of Accelerate, Lightning and DeepSpeed unscale by themselves and are not read.

Also AG135: one scaler stepping several optimizers (``X.step(opt_a)``, ``X.step(opt_b)``), a
clip after ``X.unscale_(opt_a)`` but with no ``X.unscale_(opt_b)`` before it: ``opt_b``'s
gradients enter the clip still scaled. An error when the clip's ``M.parameters()`` covers the
module ``opt_b`` was built on (``M.head.parameters()``), else a warning; silent when an
unscale of the scaler runs in another function (the order is not in sight).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted, last_part, position, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import exclusive

_TORCH_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_"})


def _bool_value(ctx: FileContext, expr: ast.AST) -> bool | None:
    """A literal bool, or a name every assignment of the file gives the same literal bool."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, bool):
        return expr.value
    name = dotted(expr)
    if name is None:
        return None
    values = ctx.values_by_name().get(name, [])
    if not values and isinstance(expr, ast.Attribute):
        field = expr.attr  # cfg.use_amp: a dataclass field's default, once per field and file
        return ctx._cached(f"ampclip_field_{field}", ctx.tree,  # type: ignore[no-any-return]
                           lambda: _dataclass_default(ctx, field))
    if values and all(isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in values):
        first = values[0]
        assert isinstance(first, ast.Constant)
        if all(isinstance(v, ast.Constant) and v.value == first.value for v in values):
            return bool(first.value)
    return None


def _dataclass_default(ctx: FileContext, field: str) -> bool | None:
    """``cfg.field`` where ``field`` is a bool field of a ``@dataclass`` of the file with a
    literal default and nothing in the file can set it: no assignment to any ``.field``, no
    ``field=`` keyword, and the class only built by calls without positional arguments or
    ``**`` (never handed to a parser or a loader, which could fill it)."""
    found: list[tuple[ast.ClassDef, bool]] = []
    for cls in ctx.of(ast.ClassDef):
        if not any(last_part(dotted(d.func if isinstance(d, ast.Call) else d)) == "dataclass"
                   for d in cls.decorator_list):
            continue
        for st in cls.body:
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == field
                    and isinstance(st.value, ast.Constant) and isinstance(st.value.value, bool)):
                found.append((cls, st.value.value))
    if len(found) != 1:
        return None
    cls, default = found[0]
    for n in ctx.of(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        if any(isinstance(t, ast.Attribute) and t.attr == field for tt in targets for t in walk_all(tt)):
            return None
    for call in ctx.of(ast.Call):
        if any(k.arg == field for k in call.keywords):
            return None
        if dotted(call.func) in {"setattr", "replace", "dataclasses.replace"}:
            return None  # (not a method named replace: ``path.replace(".pt", ...)``)
    uses: list[ast.Name] = ctx._cached("ampclip_names", ctx.tree, lambda: [
        n for n in walk_all(ctx.tree) if isinstance(n, ast.Name)])  # Names are not indexed
    for n in uses:
        if n.id != cls.name:
            continue
        parent = ctx.parents.get(n)
        if isinstance(parent, ast.Call) and parent.func is n:
            if parent.args or any(k.arg is None for k in parent.keywords):
                return None
        elif not isinstance(parent, ast.arg | ast.AnnAssign):
            return None
    return default


def _scalers(ctx: FileContext) -> dict[str, bool | None]:
    """Scaler names -> enabled (True: on unless the device lacks AMP; None: not decided)."""
    out: dict[str, bool | None] = {}
    for targets, value in ctx.assignments():
        if len(targets) != 1 or not isinstance(value, ast.Call):
            continue
        if not last_part(dotted(value.func)).endswith("gradscaler"):
            continue
        kw = next((k.value for k in value.keywords if k.arg == "enabled"), None)
        enabled: bool | None = True
        if kw is not None:
            enabled = _bool_value(ctx, kw)
        elif len(value.args) >= 5 or any(k.arg is None for k in value.keywords):
            enabled = None  # `enabled` passed positionally or through **kwargs
        prev = out.get(targets[0], enabled)
        out[targets[0]] = enabled if prev == enabled else None
    return out


def _torch_clip(call: ast.Call) -> bool:
    """``torch.nn.utils.clip_grad_norm_(...)``, ``nn.utils...``, or the bare imported name."""
    if call_attr(call) not in _TORCH_CLIPS:
        return False
    if isinstance(call.func, ast.Name):
        return True
    recv = dotted(receiver(call)) or ""
    return recv.endswith("utils")


def _arg(call: ast.Call) -> str | None:
    return dotted(call.args[0]) if call.args else None


def _built_on(ctx: FileContext, opt: str) -> str | None:
    """The module an optimizer named ``opt`` was built on (``SGD(model.head.parameters())``:
    ``model.head``), when every assignment of it says the same."""
    seen = set()
    for targets, value in ctx.assignments():
        if opt in targets and isinstance(value, ast.Call) and value.args:
            first = value.args[0]
            if isinstance(first, ast.Call) and call_attr(first) == "parameters":
                seen.add(dotted(receiver(first)))
            else:
                return None
    return seen.pop() if len(seen) == 1 and None not in seen else None


def _partly_unscaled(ctx: FileContext, name: str, uses: dict[str, list[ast.Call]],
                     clips: list[ast.Call]) -> Iterator[Finding]:
    """The clip after ``unscale_`` of some of the optimizers ``name`` steps (module doc)."""
    unscales = uses.get("unscale_", [])
    stepped = {o for c in uses.get("step", []) if (o := _arg(c))}
    if len(stepped) < 2 or not unscales:
        return
    for clip in clips:
        scope = ctx.scope_of(clip)
        if any(ctx.scope_of(u) is not scope or position(u) > position(clip) for u in unscales):
            continue
        done = {o for u in unscales if (o := _arg(u))}
        left = sorted(stepped - done)
        if not done or not left or not clip.args:
            continue
        target = clip.args[0]
        module = dotted(receiver(target)) if isinstance(target, ast.Call) \
            and call_attr(target) == "parameters" else None
        covered = [o for o in left if module and (b := _built_on(ctx, o))
                   and (b == module or b.startswith(module + "."))]
        finding = ctx.finding(
            "AG135", clip,
            f"`{call_attr(clip)}` runs after `{name}.unscale_({', '.join(sorted(done))})` but "
            f"`{left[0]}`, which `{name}.step` also steps, is not unscaled before it: "
            + (f"its parameters are in `{ast.unparse(target)}`, so " if covered else
               "if the clip covers its parameters, ")
            + "their gradients enter the clip's norm still multiplied by the loss scale, and "
            "the clip shrinks every gradient by a factor the true norm would not give")
        yield finding if covered else replace(finding, severity=Severity.WARNING,
                                              confidence=Confidence.MEDIUM)
        return


@rule("AG135")
def clip_before_unscale(ctx: FileContext) -> Iterator[Finding]:
    scalers = _scalers(ctx)
    if not scalers:
        return
    torch_clips = [c for c in ctx.of(ast.Call) if isinstance(c, ast.Call) and _torch_clip(c)]
    for scaler, on in scalers.items():
        if on is not False:
            uses_of = {a: [c for c in ctx.of(ast.Call) if isinstance(c, ast.Call)
                           and call_attr(c) == a and dotted(receiver(c)) == scaler]
                       for a in ("step", "unscale_")}
            yield from _partly_unscaled(ctx, scaler, uses_of, torch_clips)
    calls: list[ast.Call] = ctx.of(ast.Call)
    by_scaler: dict[str, dict[str, list[ast.Call]]] = {}
    for c in calls:
        attr = call_attr(c)
        name = dotted(receiver(c))
        if name in scalers and attr in ("scale", "step", "unscale_"):
            by_scaler.setdefault(name, {}).setdefault(attr, []).append(c)
    clips_by_scope: dict[int, list[ast.Call]] = {}  # a big file has many loops: look up by scope
    for c in calls:
        if _torch_clip(c):
            clips_by_scope.setdefault(id(ctx.scope_of(c)), []).append(c)
    reported: set[int] = set()
    all_steps = [(position(c), name) for name, uses in by_scaler.items() for c in uses.get("step", [])]
    for name, enabled in scalers.items():
        uses = by_scaler.get(name, {})
        if enabled is False or not uses.get("scale") or not uses.get("step"):
            continue
        unscales = uses.get("unscale_", [])
        unscale_scopes = {id(ctx.scope_of(u)) for u in unscales}  # once per scaler, not per step
        first_unscale = min((position(u) for u in unscales), default=None)
        for step in uses["step"]:
            scope = ctx.scope_of(step)
            if unscale_scopes - {id(scope)}:
                continue  # a helper unscales: whether it runs before the clip is not in sight
            for clip in clips_by_scope.get(id(scope), []):
                if (id(clip) in reported or position(clip) >= position(step)
                        or exclusive(ctx, clip, step)):
                    continue
                if first_unscale is not None and first_unscale < position(clip):
                    continue
                if any(position(clip) < at < position(step) and other != name for at, other in all_steps):
                    continue  # another scaler steps first: the clip is that scaler's window's
                reported.add(id(clip))
                after = [u for u in unscales if position(u) > position(clip)]
                finding = ctx.finding(
                    "AG135",
                    clip,
                    f"`{call_attr(clip)}` runs before any `{name}.unscale_(...)`"
                    + (f" (the one at line {after[0].lineno} comes after it)" if after else "")
                    + f": the backward ran on `{name}.scale(...)`, so it clips the gradient "
                    "multiplied by the loss scale S (65536 at the start), and "
                    f"`{name}.step` (line {step.lineno}) applies the true gradient clipped at the "
                    "threshold / S instead of at the threshold"
                    + ("" if enabled else " (when the scaler is enabled: its `enabled=` is not "
                       "decided in the file)"),
                )
                if enabled is None:
                    finding = replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                yield finding
