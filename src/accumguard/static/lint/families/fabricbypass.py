"""AG300 (F10), Fabric's form: a submodule called through the model ``fabric.setup`` returned.

``fabric.setup(model, opt)`` returns a ``_FabricModule`` around the DDP model. Its forward
runs DDP's, which arms the gradient reduction; reading an attribute of it hands back the
original module's attribute, so ``model.encoder(x)`` runs the raw submodule and the backward
of that forward reduces nothing: each rank steps on its own gradient. Reported for a call of
an attribute that a class of the file assigns a module to (``self.encoder = Tower(...)``, a
class of the file or ``nn.*``), on a name bound to ``fabric.setup``'s model, inside a loop
that runs a backward (or in a function of the file such a loop hands that model to:
``a2c_loss(agent, ...)``), unless the file marks that attribute with ``mark_forward_method``
(which routes it through the wrapper).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._wrapfacts import in_training_loop

__all__ = ["submodule_through_the_fabric_wrapper"]


def _module_classes(ctx: FileContext) -> set[str]:
    """Classes of the file that derive from a ``*Module`` base (``nn.Module``,
    ``LightningModule``), or from another such class of the file."""
    out: set[str] = set()
    classes = ctx.of(ast.ClassDef)
    for _ in range(3):
        for c in classes:
            if any((dotted(b) or "").split(".")[-1].endswith("Module") or dotted(b) in out
                   for b in c.bases):
                out.add(c.name)
    return out


def _submodule_attrs(ctx: FileContext) -> set[str]:
    """``self.X = <module>(...)`` in any class of the file: X."""
    mods = _module_classes(ctx)
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        value = node.value
        if not isinstance(value, ast.Call):
            continue
        func = dotted(value.func) or ""
        if not (func in mods or func.startswith(("nn.", "torch.nn."))):
            continue
        for t in node.targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                out.add(t.attr)
    return out


def _fabric_models(ctx: FileContext) -> set[str]:
    """Names bound to the model ``fabric.setup(...)`` / ``setup_module(...)`` returns."""
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        call = node.value
        if not (isinstance(call, ast.Call) and call_attr(call) in ("setup", "setup_module")
                and "fabric" in (dotted(call.func) or "").lower() and len(node.targets) == 1):
            continue
        tgt = node.targets[0]
        first = tgt.elts[0] if isinstance(tgt, ast.Tuple) and tgt.elts else tgt
        if isinstance(first, ast.Name):
            out.add(first.id)
    return out


def _marked(ctx: FileContext) -> set[str]:
    """Attributes the file routes through the wrapper (``mark_forward_method("encode")`` or
    ``mark_forward_method(model.encode)``)."""
    out: set[str] = set()
    for call in ctx.of(ast.Call):
        if call_attr(call) != "mark_forward_method":
            continue
        for a in call.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                out.add(a.value)
            elif isinstance(a, ast.Attribute):
                out.add(a.attr)
    return out


def _handed_in_a_training_loop(ctx: FileContext, call: ast.Call, name: str, models: set[str]) -> bool:
    """``call`` is in a function of the file whose parameter ``name`` a call inside a training
    loop gives one of ``models`` (``a2c_loss(agent, ...)`` with ``agent`` from
    ``fabric.setup``)."""
    fn = ctx.enclosing(call, (ast.FunctionDef,))
    if not isinstance(fn, ast.FunctionDef):
        return False
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if name not in params or any(isinstance(t, ast.Name) and t.id == name
                                 for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets):
        return False
    i = params.index(name)

    def index() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for c in ctx.of(ast.Call):
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name):
                out.setdefault(c.func.id, []).append(c)
        return out
    by_name: dict[str, list[ast.Call]] = ctx._cached("fabricbypass_calls_by_name", ctx.tree, index)
    for site in by_name.get(fn.name, []):
        given = next((k.value for k in site.keywords if k.arg == name),
                     site.args[i] if i < len(site.args) else None)
        if isinstance(given, ast.Name) and given.id in models and in_training_loop(ctx, site):
            return True
    return False


@rule("AG300")
def submodule_through_the_fabric_wrapper(ctx: FileContext) -> Iterator[Finding]:
    models = _fabric_models(ctx)
    if not models:
        return
    attrs = _submodule_attrs(ctx) - _marked(ctx)
    for call in ctx.of(ast.Call):
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.attr in attrs):
            continue
        if func.value.id in models and in_training_loop(ctx, call):
            pass
        elif not _handed_in_a_training_loop(ctx, call, func.value.id, models):
            continue
        yield ctx.finding(
            "AG300", call,
            f"`{func.value.id}.{func.attr}(...)` calls the submodule `{func.attr}` through the "
            "model fabric.setup returned: reading an attribute of Fabric's wrapper hands back "
            "the original module's, so this forward bypasses DDP's and its backward reduces "
            "nothing: each rank steps on its own gradient",
            fix=f"call the model itself (`{func.value.id}(...)`, with a forward that runs "
                f"`{func.attr}`), or route the method through the wrapper with "
                f"`{func.value.id}.mark_forward_method(\"{func.attr}\")`")
