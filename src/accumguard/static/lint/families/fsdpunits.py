"""AG156 (F10): an FSDP2 divide factor set on one unit while the model has several.
AG181 (F11): FSDP2's gradient sync turned off for every unit but back on for the root only,
or, unit by unit with ``recurse=False`` through a list, for every unit but the root.

``FSDPModule.set_gradient_divide_factor`` sets the reduction of the unit it is called on,
not of the units ``fully_shard`` made of its children (torch 2.13: it loops over that
module's own parameter groups; ``set_requires_gradient_sync`` recurses, this does not).
A script that shards its blocks and then the root, and sets the factor on the root alone
(``model.set_gradient_divide_factor(1.0)`` to sum over ranks), has the blocks' gradients
still averaged over the W ranks: one loss reaches every unit with the same weights, so the
units get gradients W times apart, and at most one kind is the large batch's. Reported
when the call is not inside a loop (a loop over ``model.modules()`` sets every unit), its
receiver is handed to ``fully_shard`` and another module is too, and the factor is not the
world size (FSDP2's own default).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import LOOPS, call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["divide_factor_on_one_unit", "sync_back_on_root_only"]

_FACTOR_CALLS = frozenset({"set_gradient_divide_factor", "set_reduce_scatter_divide_factor"})


def _clips_by_norm(ctx: FileContext) -> bool:
    return any(call_attr(c) in ("clip_grad_norm_", "clip_grad_norm", "clip_gradients")
               for c in ctx.of(ast.Call))


@rule("AG156")
def divide_factor_on_one_unit(ctx: FileContext) -> Iterator[Finding]:
    sharded = [(c, dotted(c.args[0])) for c in ctx.of(ast.Call)
               if call_attr(c) == "fully_shard" and c.args]
    if len(sharded) < 2 or not ctx.is_training_script():
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) not in _FACTOR_CALLS or not call.args:
            continue
        unit = dotted(receiver(call))
        if unit is None or ctx.enclosing(call, LOOPS) is not None or ctx.mentions_world(call.args[0]):
            continue
        others = [(c, d) for c, d in sharded if d != unit]
        if not others or all(d != unit for _, d in sharded):
            continue
        first = others[0][0]
        finding = ctx.finding(
            "AG156",
            call,
            f"`{ast.unparse(call)}` sets the reduction of the unit `{unit}` only (it does not "
            f"recurse): the units fully_shard made of other modules (`{ast.unparse(first)}`, "
            f"line {first.lineno}) keep FSDP2's average over the W ranks. The parameters `{unit}` "
            "holds itself get the factor, all others the average: W times apart; if it holds "
            "none of its own, every gradient is averaged, not reduced as the factor asks "
            "(gradient clipping that acts on every step can hide the difference in the update)",
        )
        # a norm clip in the file: the update matches whenever it acts (it rescales the
        # averaged and the summed gradient to the same norm), so only the gradient is proven off
        yield finding if not _clips_by_norm(ctx) else replace(
            finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


def _recurse(call: ast.Call) -> bool:
    """The ``recurse`` argument of ``set_requires_gradient_sync`` (default True)."""
    arg = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "recurse"), None)
    return not (isinstance(arg, ast.Constant) and arg.value is False)


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


@rule("AG181")
def sync_back_on_root_only(ctx: FileContext) -> Iterator[Finding]:
    """``model.set_requires_gradient_sync(False)`` (recursing: every unit off) and, on the
    window's last micro-step, ``model.set_requires_gradient_sync(True, recurse=False)``: only
    the root unit is turned back on. The units ``fully_shard`` made of the blocks never
    reduce-scatter: their sharded parameters never receive a gradient (an unsharded one
    stays behind), and the optimizer steps them on nothing. Reported when the file shards
    another module besides the receiver and turns the receiver's sync off recursively."""
    sharded = [dotted(c.args[0]) for c in ctx.of(ast.Call)
               if call_attr(c) == "fully_shard" and c.args]
    if len(sharded) < 2:
        return
    calls = [c for c in ctx.of(ast.Call)
             if call_attr(c) == "set_requires_gradient_sync" and c.args]
    off = {dotted(receiver(c)) for c in calls if _is_false(c.args[0]) and _recurse(c)}
    for call in calls:
        unit = dotted(receiver(call))
        if not _recurse(call) and not _is_false(call.args[0]) and unit not in off:
            listed = _units_without(ctx, call, off, set(sharded))
            if listed is not None:
                name, members, root = listed
                yield ctx.finding(
                    "AG181",
                    call,
                    f"`{ast.unparse(call)}` turns the gradient sync back on, unit by unit with "
                    f"recurse=False, for the modules in `{name}` ({', '.join(members)}), but "
                    f"`{root}.set_requires_gradient_sync(False)` turned it off for every unit "
                    f"and `{name}` never holds `{root}`: the root unit's own parameters (those "
                    "outside the listed units) never reduce-scatter, so they get no gradient "
                    "and the ranks' contributions are never combined",
                )
                return
        if _recurse(call) or _is_false(call.args[0]) or unit not in off \
                or not any(d != unit for d in sharded):
            continue
        yield ctx.finding(
            "AG181",
            call,
            f"`{ast.unparse(call)}` turns the gradient sync back on for `{unit}`'s own unit "
            "only, while `set_requires_gradient_sync(False)` turned it off for every unit "
            "fully_shard made (it recurses by default): the blocks' units never "
            "reduce-scatter, so their sharded parameters get no gradient and the ranks' "
            "contributions are never combined",
        )
        return


def _units_without(ctx: FileContext, call: ast.Call, off: set[str | None],
                   sharded: set[str | None]) -> tuple[str, list[str], str] | None:
    """``call`` runs on the variable of a ``for u in NAME:`` loop, and every list the file
    builds under NAME (``NAME.append(x)``, ``NAME = [x, ...]``) holds modules handed to
    ``fully_shard`` but never the module turned off recursively (``off``): ``(NAME, the
    members, that module)``. None when NAME is built any other way (an extend, a
    comprehension, a concatenation) or holds something else."""
    loop = ctx.parents.get(call)
    while loop is not None and not isinstance(loop, ast.For | ast.AsyncFor):
        loop = ctx.parents.get(loop)
    recv = dotted(receiver(call))
    if loop is None or not isinstance(loop.target, ast.Name) or loop.target.id != recv \
            or not isinstance(loop.iter, ast.Name):
        return None
    name = loop.iter.id
    members: list[str] = []
    for node in ctx.of(ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == name:
            if f.attr != "append" or len(node.args) != 1:
                return None
            members.append(dotted(node.args[0]) or "?")
    for node in ctx.of(ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.List):
                members += [dotted(e) or "?" for e in node.value.elts]
            elif not isinstance(node.value, ast.Call | ast.Name):
                return None
    for node in ctx.of(ast.AugAssign):
        if isinstance(node.target, ast.Name) and node.target.id == name:
            return None
    roots = [r for r in off if r is not None and r in sharded]
    if not members or not roots or any(m not in sharded for m in members):
        return None
    missing = [r for r in roots if r not in members]
    return (name, sorted(set(members)), missing[0]) if missing else None
