"""AG166 (F10): FSDP2 applied to a model's submodules only, never to the model itself.

``fully_shard(block)`` for every block of ``model.blocks`` makes each block a unit that
reduce-scatters its own gradients; the parameters outside those units (an embedding or stem,
a final norm, the head) belong to no unit, stay plain tensors on every rank, and nothing
reduces their gradients: each rank steps them on its own data only. torch's recipe shards the
root last (``fully_shard(model)``), which gathers every parameter not in a child unit into the
root's unit. Reported when every ``fully_shard`` of the file is applied to the loop variable
of a loop over ``<model>.<attr>``, the file never shards ``<model>`` itself, wraps it in no DDP
and all-reduces nothing by hand, and ``<model>``'s optimizer is built from
``<model>.parameters()``. An error when the file's class of ``<model>`` assigns a layer beside
the sharded container (``self.head = nn.Linear(...)``), a warning when that is not in sight.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["fsdp2_children_only"]


def _class_of(ctx: FileContext, model: str) -> ast.ClassDef | None:
    """The file's class whose instance ``model`` holds: ``model = Net()`` or ``model =
    build()`` with ``build`` returning ``Net()``."""
    classes = {c.name: c for c in ctx.of(ast.ClassDef)}
    for value in ctx.values_by_name().get(model, []):
        call: ast.AST | None = value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
                and call.func.id not in classes:
            fns = ctx.functions_by_name().get(call.func.id, [])
            rets = [r.value for f in fns[:1] for r in ast.walk(f) if isinstance(r, ast.Return)]
            call = rets[0] if len(fns) == 1 and len(rets) == 1 else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in classes:
            found: ast.ClassDef = classes[call.func.id]
            return found
    return None


def _layers_beside(cls: ast.ClassDef, container: str) -> list[str]:
    """``self.<name> = nn.<Layer>(...)`` in the class other than ``container``."""
    out = []
    for n in ast.walk(cls):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call):
            t = dotted(n.targets[0]) or ""
            f = dotted(n.value.func) or ""
            if t.startswith("self.") and t != f"self.{container}" and f.split(".")[0] in ("nn", "torch") \
                    and f.rsplit(".", 1)[-1][:1].isupper() and "ModuleList" not in f and "Sequential" not in f:
                out.append(t)
    return out


@rule("AG166")
def fsdp2_children_only(ctx: FileContext) -> Iterator[Finding]:
    shards = [c for c in ctx.of(ast.Call) if call_attr(c) == "fully_shard" and c.args]
    if not shards or any(call_attr(c) in ("all_reduce", "reduce_scatter", "reduce_scatter_tensor",
                                          "DistributedDataParallel", "DDP", "prepare")
                         for c in ctx.of(ast.Call)):
        return  # another reduction of the remaining parameters may be in place
    roots: set[str] = set()
    for call in shards:
        loop = ctx.enclosing(call, (ast.For,))
        arg = call.args[0]
        if not (isinstance(loop, ast.For) and isinstance(arg, ast.Name)
                and isinstance(loop.target, ast.Name) and loop.target.id == arg.id
                and isinstance(loop.iter, ast.Attribute) and isinstance(loop.iter.value, ast.Name)):
            return  # a module sharded outside such a loop: the root may be among them
        roots.add(loop.iter.value.id)
    if len(roots) != 1:
        return
    model = roots.pop()
    trained = any(call_attr(c) == "parameters" and dotted(getattr(c.func, "value", None)) == model
                  and isinstance(ctx.parents.get(c), ast.Call)
                  and "optim" in (dotted(ctx.parents[c].func) or "")  # type: ignore[attr-defined]
                  for c in ctx.of(ast.Call))
    if not trained:
        return
    container = shards[0]
    loop = ctx.enclosing(container, (ast.For,))
    attr = loop.iter.attr if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Attribute) else ""
    cls = _class_of(ctx, model)
    beside = _layers_beside(cls, attr) if cls is not None else []
    finding = ctx.finding(
        "AG166",
        container,
        f"`fully_shard` is applied to each module of `{model}.{attr}` but never to `{model}`, "
        "whose optimizer steps all its parameters: the parameters outside those units"
        + (f" ({', '.join(f'`{b}`' for b in beside[:4])})" if beside else "")
        + " belong to no FSDP unit and nothing reduces their gradients, so each rank steps "
        "them on its own micro-batches only",
        fix=f"after the loop, shard the root too: `fully_shard({model})` (it gathers the "
            "parameters not in a child unit into the root's unit)",
    )
    yield finding if beside else replace(finding, severity=Severity.WARNING)
