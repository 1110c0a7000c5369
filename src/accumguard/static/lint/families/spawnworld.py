"""AG170 (F10): the world size read from ``WORLD_SIZE`` in processes ``mp.spawn`` started.

``torchrun`` (and the ``deepspeed``/``accelerate`` launchers) export ``WORLD_SIZE`` to every
rank; ``torch.multiprocessing.spawn`` exports nothing: its processes inherit the parent's
environment, which has no ``WORLD_SIZE`` unless the script writes one. A read with a default
(``int(os.environ.get("WORLD_SIZE", "1"))``) then gives the default, 1, on every rank, and a
hand-written average ``all_reduce(SUM)`` then ``/ world_size`` divides by 1: the gradient is
the sum over the ranks, W x the large batch's mean. Judged when the file spawns its ranks
(not a literal single process), the only mentions of ``WORLD_SIZE`` are such reads with the
default 1 (no write to the environment, no ``"WORLD_SIZE" in os.environ`` test), no rank is
read from a launcher's variable without a default (``os.environ["LOCAL_RANK"]``: a torchrun
launch), and the value read divides something (directly, through a name or a helper of the
file that returns it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["world_size_env_under_spawn"]

_LAUNCHER_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})


def _env_key(node: ast.AST) -> tuple[str, ast.AST | None, bool] | None:
    """(key, default, has_default) of ``os.environ.get(k, d)``, ``os.getenv(k, d)`` or
    ``os.environ[k]``; None for anything else."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        f = dotted(node.func) or ""
        if f.endswith("environ.get") or f.endswith("getenv"):
            default = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "default"), None)
            return node.args[0].value, default, default is not None
    if isinstance(node, ast.Subscript) and (dotted(node.value) or "").endswith("environ") \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value, None, False
    return None


def _spawn_calls(ctx: FileContext) -> list[ast.Call]:
    out = []
    for c in ctx.of(ast.Call):
        name = call_attr(c)
        if name not in ("spawn", "start_processes"):
            continue
        nprocs = next((k.value for k in c.keywords if k.arg == "nprocs"), None)
        if isinstance(nprocs, ast.Constant) and nprocs.value == 1:
            continue
        out.append(c)
    return out


def _is_one(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in (1, "1")


@rule("AG170")
def world_size_env_under_spawn(ctx: FileContext) -> Iterator[Finding]:
    if not _spawn_calls(ctx):
        return
    reads: list[ast.AST] = []
    for n in walk_all(ctx.tree):
        if isinstance(n, ast.Constant) and n.value == "WORLD_SIZE":
            continue  # counted below through their reads
        got = _env_key(n)
        if got is None:
            continue
        key, default, has_default = got
        if key in _LAUNCHER_VARS and not has_default \
                and not (isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)):
            return  # a launcher's variable read without a default (or WORLD_SIZE written)
        if key == "WORLD_SIZE":
            if not (has_default and _is_one(default)) or isinstance(n, ast.Subscript):
                return  # a write, or a read that is not "1 when unset"
            reads.append(n)
    mentions = sum(1 for n in walk_all(ctx.tree)
                   if isinstance(n, ast.Constant) and n.value == "WORLD_SIZE")
    if not reads or mentions != len(reads):
        return  # WORLD_SIZE also written, tested or passed somewhere: not judged
    read_ids = {id(r) for r in reads}

    def holds_read(node: ast.AST) -> bool:
        return any(id(x) in read_ids for x in walk_all(node))

    helpers = {name for name, defs in ctx.defs_by_name().items()
               if any(isinstance(r, ast.Return) and r.value is not None and holds_read(r.value)
                      for d in defs for r in walk_all(d))}

    def is_world(node: ast.AST, names: set[str]) -> bool:
        for x in walk_all(node):
            if id(x) in read_ids:
                return True
            if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id in helpers:
                return True
            if isinstance(x, ast.Name) and x.id in names:
                return True
        return False

    names: set[str] = set()
    for _ in range(3):  # names assigned from the read, a helper, or such a name
        for n in ctx.of(ast.Assign):
            if is_world(n.value, names):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
                names |= {dotted(t) or "" for t in n.targets if isinstance(t, ast.Attribute)}
    names.discard("")

    def divisor(n: ast.AST) -> ast.AST | None:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv):
            return n.right
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div | ast.FloorDiv):
            return n.value
        if isinstance(n, ast.Call) and call_attr(n) in ("div_", "div") and n.args:
            return n.args[0]
        return None

    for n in walk_all(ctx.tree):
        d = divisor(n)
        if d is None or not is_world(d, names):
            continue
        read = reads[0]
        yield ctx.finding(
            "AG170",
            n,
            f"`{ast.unparse(d)}` is the world size read as `{ast.unparse(read)}`, but the "
            "ranks are started by `spawn`, which sets no `WORLD_SIZE` (only launchers such as "
            "torchrun do): every rank reads 1, so this division averages nothing and the "
            "summed gradient stays W x the large batch's mean",
        )
        return
