"""AG124's Lightning shape: a ``LightningModule.configure_optimizers`` that sizes its schedule
from the number of training batches per epoch (``len(self.train_dataloader())``,
``self.trainer.num_training_batches``, ``len(self.trainer.train_dataloader)``, a datamodule's
``train_dataloader()``), with no division by K, and returns it with ``"interval": "step"``
while the file's ``Trainer(accumulate_grad_batches=K)`` has K > 1. Lightning 2.6 steps a
step-interval scheduler only when the optimizer steps (``_update_learning_rates`` returns
while ``_should_accumulate()``), once per K batches, so the schedule is K times too long.

Only what is in sight is judged: every ``Trainer(...)`` of the file must set
``accumulate_grad_batches`` to integers above 1, the horizon's arithmetic must be products,
sums and differences of the batch count with names, attributes and integer literals (no
division but by the world size, no other call, no name of K), and the scheduler entry must say ``"interval":
"step"`` with no ``frequency`` other than 1."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from accumguard.static.lint._ast import dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._lightning import automatic_lightning_module
from accumguard.static.lint.families.epochtail import _imports_lightning

__all__ = ["lightning_micro_horizons"]

HorizonOf = Callable[[FileContext, ast.Call], "ast.AST | None"]
_HORIZON_CTORS = frozenset({
    "CosineAnnealingLR", "LinearLR", "PolynomialLR", "ConstantLR", "OneCycleLR", "LambdaLR",
    "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup", "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_wsd_schedule", "get_scheduler",
})
_PLAIN_CALLS = frozenset({"int", "float"})


def _tail(node: ast.AST) -> str:
    return (dotted(node) or "").rsplit(".", 1)[-1]


def trainer_k(ctx: FileContext) -> int | None:
    """K when every ``Trainer(...)`` of a Lightning file sets ``accumulate_grad_batches`` to one
    integer above 1 (a literal, or a name or field the file gives that one integer); else None."""
    def compute() -> int | None:
        if not _imports_lightning(ctx):
            return None
        values: set[int | None] = set()
        calls = [c for c in ctx.of(ast.Call) if _tail(c.func) == "Trainer"]
        for call in calls:
            kws = {k.arg: k.value for k in call.keywords}
            if None in kws or "accumulate_grad_batches" not in kws:
                return None  # `**cfg`, or K = 1 for this Trainer
            values |= ctx.int_candidates(kws["accumulate_grad_batches"])
        if len(values) != 1 or None in values:
            return None
        k = next(iter(values))
        return k if k is not None and k > 1 else None
    return ctx._cached("lghorizon_k", ctx.tree, compute)  # type: ignore[no-any-return]


class _Scope:
    """The names ``configure_optimizers`` assigns (once each), then the file's."""

    def __init__(self, ctx: FileContext, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.ctx = ctx
        self.func = func
        self.local: dict[str, list[ast.AST]] = {}
        for node in walk_all(func):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for x in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                        if (d := dotted(x)) is not None:
                            # an unpacked target has no value of its own: never expanded
                            value = node.value if x is t else ast.Constant(value=None)
                            self.local.setdefault(d, []).append(value)

    def value(self, name: str) -> ast.AST | None:
        values = self.local.get(name)
        if values is None:
            values = self.ctx.values_by_name().get(name, [])
        return values[0] if len(values) == 1 else None

    def batch_count(self, node: ast.AST) -> bool:
        """``node`` is the number of training batches of one epoch, as Lightning code spells it."""
        if isinstance(node, ast.Attribute) and node.attr == "num_training_batches":
            return last_part(dotted(node.value)).endswith("trainer")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
                and len(node.args) == 1 and not node.keywords):
            return False
        arg: ast.AST = node.args[0]
        if isinstance(arg, ast.Name) and (bound := self.value(arg.id)) is not None:
            arg = bound  # `loader = self.train_dataloader()` then `len(loader)`
        if isinstance(arg, ast.Call) and not arg.args and not arg.keywords:
            arg = arg.func
        return isinstance(arg, ast.Attribute) and arg.attr == "train_dataloader"

    def parts(self, expr: ast.AST, depth: int = 3) -> list[ast.AST]:
        """``expr`` and the values of the names in it (assigned once), ``depth`` levels down."""
        out = [expr]
        if depth == 0:
            return out
        for n in self.arithmetic(expr):
            if isinstance(n, ast.Name | ast.Attribute) and (d := dotted(n)) is not None:
                v = self.value(d)
                if v is not None and v is not expr:
                    out += self.parts(v, depth - 1)
        return out

    def arithmetic(self, expr: ast.AST) -> Iterator[ast.AST]:
        """The nodes of ``expr`` outside its batch counts."""
        todo = [expr]
        while todo:
            node = todo.pop()
            yield node
            if not self.batch_count(node):
                todo.extend(ast.iter_child_nodes(node))

    def per_rank(self, node: ast.BinOp) -> bool:
        """``count // self.trainer.world_size``: the batches of one rank, still a count of
        micro-batches (a division by the world size, with no K in it)."""
        return isinstance(node.op, ast.Div | ast.FloorDiv) and self.ctx.mentions_world(node.right) \
            and not self.ctx.mentions_accum(node.right)

    def micro_count(self, horizon: ast.AST) -> ast.AST | None:
        """The batch count the horizon is built from, when it is that count times, plus or minus
        things with no K in them (no division, no call, no name of K); else None."""
        parts = self.parts(horizon)
        counts = [n for p in parts for n in walk_all(p) if self.batch_count(n)]
        if not counts:
            return None
        for p in parts:
            for n in self.arithmetic(p):
                if self.batch_count(n):
                    continue
                if isinstance(n, ast.BinOp) and not isinstance(n.op, ast.Mult | ast.Add | ast.Sub) \
                        and not self.per_rank(n):
                    return None  # `// K`, `/ 4`, `% ...`: scaled, not a plain count
                if isinstance(n, ast.Call) and dotted(n.func) not in _PLAIN_CALLS:
                    return None  # `min(...)`, `math.ceil(a / k)`: not read
                if isinstance(n, ast.Constant) and isinstance(n.value, float):
                    return None  # `0.25 * len(...)`: maybe 1 / K
                if isinstance(n, ast.IfExp | ast.BoolOp | ast.Compare | ast.Lambda):
                    return None
                if isinstance(n, ast.Name | ast.Attribute) and (
                        self.ctx.mentions_accum(n) or "stepping_batches" in (dotted(n) or "")):
                    return None  # K (or the optimizer-step count) is in the horizon
        return counts[0]

    def lambda_horizon(self, call: ast.Call) -> ast.AST | None:
        """The outside name a ``LambdaLR`` factor (a lambda, or a ``def`` of this method or of
        the file) reads that holds a count of batches (``lambda s: 1 - s / total``)."""
        fn = next((k.value for k in call.keywords if k.arg == "lr_lambda"),
                  call.args[1] if len(call.args) > 1 else None)
        body: ast.AST | None = fn if isinstance(fn, ast.Lambda) else None
        if isinstance(fn, ast.Name):
            inner = [d for d in walk_all(self.func) if isinstance(d, ast.FunctionDef) and d.name == fn.id]
            defs = inner or self.ctx.defs_by_name().get(fn.id, [])
            body = defs[0] if len(defs) == 1 else None
        if not isinstance(body, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        a = body.args
        own = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        own |= {n.id for n in walk_all(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        free = [n for n in walk_all(body) if isinstance(n, ast.Name | ast.Attribute)
                and isinstance(n.ctx, ast.Load) and (d := dotted(n)) is not None
                and d.split(".", 1)[0] not in own]
        for depth in (1, 2, 3):  # the name nearest to its count: `total`, not `warmup` from it
            for n in free:
                if any(self.batch_count(x) for p in self.parts(n, depth) for x in walk_all(p)):
                    return n
        return None


def _entry(node: ast.AST) -> dict[str, ast.AST] | None:
    """A scheduler entry: ``{"scheduler": ..., "interval": ...}`` or ``dict(scheduler=...)``."""
    out: dict[str, ast.AST]
    if isinstance(node, ast.Dict):
        out = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
               if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if None in node.keys:
            return None  # `{**base, ...}`: not all in sight
    elif isinstance(node, ast.Call) and dotted(node.func) == "dict" and not node.args:
        if any(k.arg is None for k in node.keywords):
            return None
        out = {k.arg: k.value for k in node.keywords if k.arg}
    else:
        return None
    return out if "scheduler" in out else None


def lightning_micro_horizons(ctx: FileContext, horizon_of: HorizonOf) -> Iterator[tuple[ast.Call, str]]:
    """(scheduler constructor, message) of each step-interval scheduler a LightningModule's
    ``configure_optimizers`` sizes in micro-batches while the Trainer accumulates K > 1."""
    k = trainer_k(ctx)
    if k is None:
        return
    for func in ctx.defs_by_name().get("configure_optimizers", []):
        if not automatic_lightning_module(ctx, func):
            continue  # manual optimisation steps its own schedulers
        scope = _Scope(ctx, func)
        for node in walk_all(func):
            entry = _entry(node)
            if entry is None:
                continue
            interval, freq = entry.get("interval"), entry.get("frequency")
            if not (isinstance(interval, ast.Constant) and interval.value == "step"):
                continue  # Lightning's default interval is "epoch"
            if freq is not None and ctx.int_value(freq) != 1:
                continue
            ctor = entry["scheduler"]
            if isinstance(ctor, ast.Name | ast.Attribute) and (d := dotted(ctor)) is not None:
                ctor = scope.value(d) or ctor
            if not isinstance(ctor, ast.Call) or _tail(ctor.func) not in _HORIZON_CTORS:
                continue
            lam = _tail(ctor.func) == "LambdaLR"
            horizon = scope.lambda_horizon(ctor) if lam else horizon_of(ctx, ctor)
            if horizon is None:
                continue
            count = scope.micro_count(horizon)
            if count is None:
                times_k = _stepping_times_k(ctx, scope.parts(horizon))
                if times_k is not None:
                    yield ctor, (
                        f"the schedule's horizon multiplies `{ast.unparse(times_k)}`: "
                        "`estimated_stepping_batches` already counts optimizer steps (Lightning "
                        f"divides the batches by accumulate_grad_batches={k} for it), so the "
                        f"schedule is {k} times longer than training and never reaches its end")
                continue
            shown = ast.unparse(horizon)
            if not isinstance(horizon, ast.Call | ast.BinOp) and (v := scope.value(shown)) is not None:
                shown = f"{shown} = {ast.unparse(v)}"
            yield ctor, (
                f"the schedule's horizon `{shown}` counts micro-batches (`{ast.unparse(count)}` is "
                f"the number of batches per epoch), but with `accumulate_grad_batches={k}` Lightning "
                f"steps an `\"interval\": \"step\"` scheduler once per optimizer step, once per {k} "
                f"batches: the schedule is {k} times longer than training and never reaches its end"
            )


def _stepping_times_k(ctx: FileContext, parts: list[ast.AST]) -> ast.BinOp | None:
    """A product of ``estimated_stepping_batches`` (optimizer steps already) and K
    (``accumulate_grad_batches``, or a name the file gives the Trainer as K) in the horizon."""
    for p in parts:
        for n in walk_all(p):
            if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)):
                continue
            sides = (n.left, n.right)
            if any("estimated_stepping_batches" in (dotted(x) or "") for x in sides) \
                    and any(isinstance(x, ast.Name | ast.Attribute) and ctx.mentions_accum(x)
                            for x in sides):
                return n
    return None
