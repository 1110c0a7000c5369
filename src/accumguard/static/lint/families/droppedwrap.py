"""AG377 (F10): the data-parallel wrapper is made and its result dropped.

``DDP(net)``, ``accelerator.prepare_model(net)``, ``accelerator.prepare(net, ...)`` and
``fabric.setup(net, ...)`` return a new object; DDP reduces only the gradients of backwards
that came from the wrapper's own forward. Called as a statement
(``self.accelerator.prepare_model(self.model)``), the wrapper is lost and the name still
holds the bare module: the training forward runs on it, nothing is averaged over the ranks,
each rank steps on its own gradient. Reported when that name's forward then runs in training
(a loop with a backward, a micro-step method, or a function they call) and the file does not
shard with FSDP. (A wrapper's name rebound to the inner module compiled, nanoGPT's order
turned round, is AG300's.)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._wrapfacts import mentions_fsdp, trains

__all__ = ["wrapper_dropped"]

_DDP = frozenset({"DistributedDataParallel", "DDP"})
_PREPARES = frozenset({"prepare", "prepare_model", "setup", "setup_module"})
_LAUNCHERS = re.compile(r"accelerat|fabric", re.IGNORECASE)


def _wrapped_module(call: ast.Call) -> str | None:
    """The module ``call`` wraps for data parallelism (its first argument's name), or None."""
    name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if name in _DDP or (name in _PREPARES and _LAUNCHERS.search(dotted(receiver(call)) or "")):
        first = call.args[0] if call.args else None
        return dotted(first) if isinstance(first, ast.Name | ast.Attribute) else None
    return None


def _forwards_after(ctx: FileContext, name: str, line: int) -> ast.Call | None:
    """The first call ``name(...)`` after ``line`` that runs in training."""
    return next((c for c in ctx.of(ast.Call) if isinstance(c, ast.Call) and c.lineno > line
                 and dotted(c.func) == name and trains(ctx, c)), None)


def _discarded(ctx: FileContext) -> Iterator[tuple[ast.AST, str, str]]:
    """(wrap call, module name, how it was lost) for a wrapping call used as a statement."""
    for stmt in walk_all(ctx.tree):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and not any(k.arg == "evaluation_mode" for k in stmt.value.keywords) \
                and (raw := _wrapped_module(stmt.value)) is not None:
            yield (stmt.value, raw,
                   f"`{ast.unparse(stmt.value)}` returns the data-parallel wrapper and the line "
                   f"drops it: `{raw}` is still the bare module")


@rule("AG377")
def wrapper_dropped(ctx: FileContext) -> Iterator[Finding]:
    if mentions_fsdp(ctx):
        return
    for anchor, name, lost in _discarded(ctx):
        forward = _forwards_after(ctx, name, getattr(anchor, "lineno", 0))
        if forward is None:
            continue
        yield ctx.finding(
            "AG377",
            anchor,
            f"{lost}; the training forward at line {forward.lineno} (`{name}(...)`) runs on a "
            "module no wrapper sees: DDP never averages these gradients over the ranks, and each "
            "rank steps on its own",
        )
        return
