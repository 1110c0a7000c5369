"""A boundary test that names a method without calling it (F1): AG375.

``if self.at_boundary:`` where ``at_boundary`` is a method of the class (no ``@property``)
tests the bound method object, which is always true: the optimizer step under it runs on
every micro-batch, as if nothing accumulated.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["boundary_method_never_called"]

_STEPS = frozenset({"step", "zero_grad"})


def _plain_methods(cls: ast.ClassDef) -> set[str]:
    """Methods of ``cls`` that are not properties (nor static/class methods)."""
    out: set[str] = set()
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                (d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else "")
                in ("property", "cached_property", "staticmethod", "classmethod", "setter")
                for d in fn.decorator_list):
            out.add(fn.name)
    return out


@rule("AG375")
def boundary_method_never_called(ctx: FileContext) -> Iterator[Finding]:
    for cls in ctx.of(ast.ClassDef):
        methods = _plain_methods(cls)
        if not methods:
            continue
        for node in walk_all(cls):
            if not isinstance(node, ast.If):
                continue
            test = node.test  # (`if not self.at_boundary:` never runs: not F1's, not judged)
            if not (isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name)
                    and test.value.id == "self" and test.attr in methods):
                continue
            steps = [c for c in walk_all(node) if isinstance(c, ast.Call)
                     and call_attr(c) in _STEPS and ctx.kind_of_receiver(c.func.value
                     if isinstance(c.func, ast.Attribute) else None) in ("optimizer", "engine")]
            helper = [c for c in walk_all(node) if isinstance(c, ast.Call)
                      and (fn := ctx.callee_of(c)) is not None and any(
                          isinstance(s, ast.Call) and call_attr(s) == "step" for s in walk_all(fn))]
            if not steps and not helper:
                continue
            yield ctx.finding(
                "AG375", test,
                f"`if self.{test.attr}:` tests the method `{test.attr}` without calling it: a "
                "bound method is always true, so the optimizer steps on every micro-batch, as "
                "if nothing accumulated",
                fix=f"call it: `if self.{test.attr}():`")
            return
