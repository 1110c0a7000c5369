"""Parameters the data-parallel wrapper never registers (F10), beside :mod:`.unreduced`'s
parameters no reduction covers.

AG357: a tensor that requires a gradient but is not a parameter (a buffer registered with
``requires_grad=True``, a learned temperature FSDP2 would not take as a 0-d parameter; a plain
tensor attribute of a module) in a data-parallel file that reduces no gradient by hand, and
that an optimizer steps: the wrappers reduce parameters' gradients only.

AG359: ``DDP._set_params_and_buffers_to_ignore_for_model(model, names)`` given names taken
from ``named_parameters()`` with no ``requires_grad`` filter: DDP neither broadcasts nor
reduces what it ignores, so the trainable ones among them train on each rank's own gradient.

AG363: the file's only DDP/FSDP wrap is of a submodule put back in place (``net.backbone =
DDP(net.backbone)``) while an optimizer steps a larger module's parameters: the rest of that
module trains on each rank's own gradient (a warning when the file freezes something).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import OPTIMIZER_CLASSES, call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._parallel import data_parallel
from accumguard.static.lint.families.unreduced import _in_module_class, reduces_grads_by_hand

__all__ = ["grad_tensor_outside_the_reduction", "submodule_wrapped_in_place",
           "trained_parameters_ignored_by_ddp"]


def _grad_tensors(ctx: FileContext) -> list[tuple[ast.AST, str, str]]:
    """Tensors that require a gradient but are not parameters: ``self.register_buffer("name",
    <a tensor made with requires_grad=True>)`` and, in an ``nn.Module`` subclass,
    ``self.name = torch.full(..., requires_grad=True)``: (node, name, "buffer"/"attribute")."""
    def wants_grad(value: ast.AST) -> bool:
        return any(isinstance(n, ast.keyword) and n.arg == "requires_grad"
                   and isinstance(n.value, ast.Constant) and n.value.value is True
                   for n in walk_all(value)) or any(
            isinstance(n, ast.Call) and call_attr(n) == "requires_grad_" for n in walk_all(value))
    out: list[tuple[ast.AST, str, str]] = []
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        if call_attr(call) == "register_buffer" and len(call.args) >= 2 \
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str) \
                and wants_grad(call.args[1]):
            out.append((call, call.args[0].value, "buffer"))
    assigns: list[ast.Assign] = ctx.of(ast.Assign)
    for a in assigns:
        if len(a.targets) == 1 and isinstance(t := a.targets[0], ast.Attribute) \
                and dotted(t.value) == "self" and isinstance(a.value, ast.Call) \
                and last_part(dotted(a.value.func)) != "parameter" \
                and "parameter" not in {last_part(dotted(n.func)) for n in walk_all(a.value)
                                        if isinstance(n, ast.Call)} \
                and wants_grad(a.value) and _in_module_class(ctx, a):
            out.append((a, t.attr, "attribute"))
    return out


def _tensor_stepped(ctx: FileContext, attr: str) -> ast.Call | None:
    """An optimizer (or ``add_param_group``) given ``<obj>.<attr>``: directly, through a name,
    or through a method whose return value holds ``self.<attr>`` (``temperature_params()``)."""
    def held(n: ast.AST) -> bool:
        return (dotted(n) or "").endswith("." + attr) and not isinstance(ctx.parents.get(n), ast.Attribute)
    returning = {f.name for f in ctx.of(ast.FunctionDef) if any(
        isinstance(r, ast.Return) and r.value is not None
        and any(dotted(n) == f"self.{attr}" for n in walk_all(r.value)) for r in walk_all(f))}
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        if not (last_part(dotted(call.func)) in OPTIMIZER_CLASSES
                or call_attr(call) == "add_param_group") or not call.args:
            continue
        sources: list[ast.AST] = [call.args[0]]
        for n in walk_all(call.args[0]):
            if isinstance(n, ast.Name):
                sources += ctx.assigned_in(ctx.scope_of(call)).get(n.id, [])
        if any(held(n) or (isinstance(n, ast.Call) and call_attr(n) in returning)
               for src in sources for n in walk_all(src)):
            return call
    return None


@rule("AG357")
def grad_tensor_outside_the_reduction(ctx: FileContext) -> Iterator[Finding]:
    """AG357 (F10): a tensor that requires a gradient but is not a parameter (a buffer
    registered with ``requires_grad=True``, FSDP2 refusing a 0-d parameter; a plain tensor
    attribute of a module, ``self.log_std = torch.full(..., requires_grad=True)``) in a
    data-parallel file, that an optimizer steps: the wrappers reduce the gradients of
    parameters only."""
    if not data_parallel(ctx) or reduces_grads_by_hand(ctx):
        return
    for node, attr, kind in _grad_tensors(ctx):
        opt = _tensor_stepped(ctx, attr)
        if opt is None:
            continue  # a tensor no optimizer steps (a checkpointing dummy): nothing drifts
        what = "registered as a buffer" if kind == "buffer" else "a plain tensor attribute of the module"
        yield ctx.finding(
            "AG357",
            node,
            f"`{attr}` is {what} that requires a gradient, not a parameter, and the optimizer "
            f"at line {opt.lineno} steps it: the data-parallel wrapper reduces the gradients of "
            "parameters only, so each rank's copy learns from its own micro-batches"
            + (" (under DDP the next forward's buffer broadcast then copies rank 0's value over "
               "the others)" if kind == "buffer" else ""),
        )
        return


def _names_from_parameters(ctx: FileContext, expr: ast.AST) -> ast.Call | None:
    """The ``named_parameters()``/``parameters()`` call a list of names is built from
    (directly, or through a name bound in the same scope), when no ``requires_grad`` test
    filters it (a list of frozen parameters is fine to ignore)."""
    sources: list[ast.AST] = [expr]
    if isinstance(expr, ast.Name):
        sources += ctx.assigned_in(ctx.scope_of(expr)).get(expr.id, [])
    for src in sources:
        if "requires_grad" in ast.unparse(src):
            continue
        found = next((n for n in walk_all(src) if isinstance(n, ast.Call)
                      and call_attr(n) in ("named_parameters", "parameters")), None)
        if found is not None:
            return found
    return None


@rule("AG359")
def trained_parameters_ignored_by_ddp(ctx: FileContext) -> Iterator[Finding]:
    """AG359 (F10): ``DDP._set_params_and_buffers_to_ignore_for_model(model, names)`` with
    names taken from ``named_parameters()`` (not only buffers) and not filtered to the frozen
    ones: DDP never all-reduces an ignored parameter's gradient, so each rank steps its own."""
    if reduces_grads_by_hand(ctx):
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) != "_set_params_and_buffers_to_ignore_for_model" or len(call.args) < 2:
            continue
        source = _names_from_parameters(ctx, call.args[1])
        if source is None:
            continue
        frozen = _frozen_somewhere(ctx)
        f = ctx.finding(
            "AG359",
            call,
            f"the names DDP is told to ignore come from `{ast.unparse(source)}` (line "
            f"{source.lineno}), with no requires_grad filter"
            + (" (the file freezes some parameters: if every ignored one is frozen, this is "
               "fine)" if frozen else ", so they include trainable parameters")
            + ": DDP never all-reduces an ignored parameter's gradient, and each rank steps a "
            "trainable one on its own micro-batches",
        )
        yield f if not frozen else replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        return


def _frozen_somewhere(ctx: FileContext) -> bool:
    """The file turns ``requires_grad`` off somewhere (``requires_grad_(False)``,
    ``.requires_grad = False``)."""
    return any((isinstance(n, ast.Call) and call_attr(n) == "requires_grad_" and n.args
                and isinstance(n.args[0], ast.Constant) and n.args[0].value is False)
               or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                   and n.value.value is False and any(
                       isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets))
               for n in walk_all(ctx.tree))


@rule("AG363")
def submodule_wrapped_in_place(ctx: FileContext) -> Iterator[Finding]:
    """AG363 (F10): the file's only DDP wrap is of a submodule, put back in place
    (``net.backbone = DDP(net.backbone)``), while an optimizer steps the parameters of a
    larger module: DDP averages the submodule's gradients only, the rest (task heads) train on
    each rank's own gradient."""
    wraps = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").rsplit(".", 1)[-1]
             in ("DDP", "DistributedDataParallel", "fully_shard", "FSDP", "FullyShardedDataParallel")]
    if len(wraps) != 1 or reduces_grads_by_hand(ctx):
        return
    wrap = wraps[0]
    owner = ctx.parents.get(wrap)
    if not (isinstance(owner, ast.Assign) and len(owner.targets) == 1 and wrap.args
            and isinstance(t := owner.targets[0], ast.Attribute)
            and dotted(t) == dotted(wrap.args[0])):
        return
    sub = dotted(t) or ""
    opts = [c for c in ctx.of(ast.Call) if last_part(dotted(c.func)) in OPTIMIZER_CLASSES and c.args]
    whole = [o for o in opts if any(
        isinstance(n, ast.Call) and call_attr(n) == "parameters" and isinstance(n.func, ast.Attribute)
        and (dotted(n.func.value) or "") not in (sub, sub.rsplit(".", 1)[-1])
        for n in walk_all(o.args[0]))]
    if not whole or len(whole) != len(opts):
        return
    f = ctx.finding(
        "AG363", wrap,
        f"`{sub} = {ast.unparse(wrap.func)}({sub})` wraps one submodule in place, the file's only "
        f"data-parallel wrap, while the optimizer at line {whole[0].lineno} steps the parameters "
        f"of `{ast.unparse(whole[0].args[0])}`: the wrapper averages the gradients of `{sub}` "
        "only, and every other parameter of the module around it (task heads) trains on each "
        "rank's own gradient")
    yield f if not _frozen_somewhere(ctx) else replace(
        f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
