"""A module an optimizer steps that Fabric never set up (F10): AG341.

Under a data-parallel Fabric (``devices`` > 1, a DDP or FSDP strategy), only what is given to
``fabric.setup(...)`` / ``fabric.setup_module(...)`` is wrapped, and only the wrapper's
gradients are averaged over the ranks. An actor-critic that sets up the policy and moves the
value network ``.to(fabric.device)`` while one optimizer steps both (``Adam(agent.parameters())``)
trains the value network on each rank's own gradient: the ranks' copies drift apart.

Reported when an optimizer is built over ``R.parameters()`` (directly or through a name), R
itself is never set up, and some part of R is: each other part of R the file uses
(``R.value``, moved or called) that is never set up either; or when R and every part of it
are never set up while another module is. Silent when the script all-reduces gradients by
hand, or when the file's ``Fabric(...)`` runs one device.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import OPTIMIZER_CLASSES, call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._parallel import multi_device
from accumguard.static.lint.families.unreduced import reduces_grads_by_hand

__all__ = ["module_fabric_never_set_up"]


def _data_parallel_fabric(ctx: FileContext) -> bool:
    """Every ``Fabric(...)`` of the file runs data-parallel (:func:`multi_device`)."""
    fabrics = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Fabric"]
    return bool(fabrics) and all(multi_device(c) for c in fabrics)


def _set_up(ctx: FileContext) -> set[str]:
    """Dotted names given to ``fabric.setup(...)`` / ``fabric.setup_module(...)``."""
    out = set()
    for c in ctx.of(ast.Call):
        if call_attr(c) in ("setup", "setup_module") and "fabric" in (dotted(c.func) or "").lower():
            out |= {d for a in c.args if (d := dotted(a))}
    return out


def _optimized_roots(ctx: FileContext) -> list[tuple[str, ast.Call]]:
    """(R, optimizer call) for each ``R.parameters()`` an optimizer constructor is given."""
    out = []
    for call in ctx.of(ast.Call):
        if last_part(dotted(call.func)) not in OPTIMIZER_CLASSES or not call.args:
            continue
        sources: list[ast.AST] = [call.args[0]]
        if isinstance(call.args[0], ast.Name):
            sources += ctx.assigned_in(ctx.scope_of(call)).get(call.args[0].id, [])
        for src in sources:
            for n in walk_all(src):
                if isinstance(n, ast.Call) and call_attr(n) in ("parameters", "named_parameters") \
                        and isinstance(n.func, ast.Attribute) and (r := dotted(n.func.value)):
                    out.append((r, call))
    return out


def _parts_used(ctx: FileContext, root: str) -> dict[str, ast.AST]:
    """Each ``root.X`` the file reads outside a class body (first use), X not a method."""
    out: dict[str, ast.AST] = {}
    for n in walk_all(ctx.tree):
        if not isinstance(n, ast.Attribute):
            continue
        d = dotted(n)
        if d is None or not d.startswith(root + ".") or d.count(".") != root.count(".") + 1:
            continue
        if n.attr in ("parameters", "named_parameters", "to", "train", "eval", "state_dict",
                      "load_state_dict", "zero_grad", "cuda", "cpu", "modules", "children"):
            continue
        if ctx.enclosing(n, (ast.ClassDef,)) is None:
            out.setdefault(d, n)
    return out


def _module_attrs(ctx: FileContext, root: str) -> set[str] | None:
    """The attributes ``root``'s class (a class of the file that ``root`` is built from)
    assigns a constructed object in its ``__init__`` (``self.value = nn.Sequential(...)``):
    its submodules; None when the class is not in sight."""
    values = ctx.values_by_name().get(root, [])
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    name = (dotted(values[0].func) or "").rsplit(".", 1)[-1]
    cls = next((c for c in ctx.of(ast.ClassDef) if c.name == name), None)
    if cls is None:
        return None
    out = set()
    for fn in cls.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
            continue
        for n in walk_all(fn):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) \
                    and (ctor := (dotted(n.value.func) or "").rsplit(".", 1)[-1])[:1].isupper() \
                    and ctor != "Parameter":
                out |= {t.attr for t in n.targets if isinstance(t, ast.Attribute)
                        and dotted(t.value) == "self"}
    return out


@rule("AG341")
def module_fabric_never_set_up(ctx: FileContext) -> Iterator[Finding]:
    if not _data_parallel_fabric(ctx) or reduces_grads_by_hand(ctx):
        return
    done = _set_up(ctx)
    if not done:
        return
    for root, opt in _optimized_roots(ctx):
        if root in done:
            continue
        parts = _parts_used(ctx, root)
        modules = _module_attrs(ctx, root) or set()
        inside = [p for p in parts if p in done]
        left = [p for p in parts if p not in done and p.rsplit(".", 1)[-1] in modules]
        if inside and left:
            yield ctx.finding(
                "AG341", parts[left[0]],
                f"`{left[0]}` is stepped by the optimizer over `{root}.parameters()` (line "
                f"{opt.lineno}) but never given to `fabric.setup`/`setup_module`, while "
                f"`{inside[0]}` is: Fabric averages the gradients of the modules it set up only, "
                f"so each rank steps `{left[0]}`'s parameters on its own gradient")
            return
        if not inside and not any(d.startswith(root + ".") or root.startswith(d + ".")
                                  for d in done):
            yield ctx.finding(
                "AG341", opt,
                f"the optimizer steps `{root}.parameters()`, but `{root}` is never given to "
                "`fabric.setup`/`setup_module` while other modules are: Fabric averages the "
                f"gradients of the modules it set up only, so each rank steps `{root}`'s "
                "parameters on its own gradient")
            return
