"""AG131 (F7): a Lightning epoch shorter than the accumulation window, or a tail left short.

``Trainer(limit_train_batches=n, accumulate_grad_batches=K)``: Lightning 2.6.6 ends every
epoch after n batches (fewer if the loader is shorter), steps the optimizer on the epoch's
last batch whatever the window holds (``_TrainingEpochLoop._should_accumulate``: "Lightning
steps on the final batch"), and divides every batch's loss by K regardless
(``ClosureResult.from_training_step_output(..., normalize=accumulate_grad_batches)``). So a
window of r < K batches is stepped with r/K of its mean gradient (F7: the final partial
window scaled by 1/K). With n < K every window of every epoch is such a tail: an error.
With n > K and n % K != 0 the last window of each epoch is short unless the loader itself
is shorter than n (not in sight): a warning. Not reported: n a multiple of K, a fraction
(``limit_train_batches=0.25``: the count depends on the loader), a strategy that handles
accumulation itself (DeepSpeed), values the file does not show.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._lengths import dataset_class_len, static_len
from accumguard.static.lint._rule import rule

__all__ = ["fit_batches", "lightning_epoch_shorter_than_window", "single_assignments"]


def _imports_lightning(ctx: FileContext) -> bool:
    for node in ctx.of(ast.Import, ast.ImportFrom):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if any(n.split(".")[0] in ("lightning", "pytorch_lightning") for n in names):
            return True
    return False


_DATA_FACTORIES = frozenset({"randn", "rand", "zeros", "ones", "empty", "arange", "randperm"})


def single_assignments(ctx: FileContext) -> dict[str, list[ast.AST]]:
    """Per plain name: the values of its single-target assignments (one pass, cached)."""
    def compute() -> dict[str, list[ast.AST]]:
        out: dict[str, list[ast.AST]] = {}
        for names, v in ctx.assignments():
            if len(names) == 1:
                out.setdefault(names[0], []).append(v)
        return out
    return ctx._cached("single_assignments", ctx.tree, compute)  # type: ignore[no-any-return]


def _single_value(ctx: FileContext, expr: ast.AST) -> ast.AST:
    """``expr``, or the one value its name (or ``self.x``) is assigned in the file."""
    d = dotted(expr) if isinstance(expr, ast.Name | ast.Attribute) else None
    if d is not None:
        values = single_assignments(ctx).get(d, [])
        if len(values) == 1:
            return values[0]
    return expr


def _unpacked(ctx: FileContext, name: ast.AST) -> ast.AST | None:
    """What a name unpacked from a file function's returned tuple holds there
    (``feats, labels = make_data()`` with ``x = torch.randn(36, 10)`` and ``return x, y``)."""
    if not isinstance(name, ast.Name):
        return None
    for node in ctx.of(ast.Assign):
        target, value = node.targets[0], node.value
        if not (len(node.targets) == 1 and isinstance(target, ast.Tuple) and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)):
            continue
        idx = next((i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == name.id), None)
        defs = ctx.defs_by_name().get(value.func.id, [])
        if idx is None or len(defs) != 1:
            continue
        returns = [r.value for r in ast.walk(defs[0]) if isinstance(r, ast.Return) and r.value is not None]
        if len(returns) != 1 or not isinstance(returns[0], ast.Tuple) \
                or len(returns[0].elts) != len(target.elts):
            return None
        held = returns[0].elts[idx]
        if isinstance(held, ast.Name):
            values = ctx.assigned_in(defs[0]).get(held.id, [])
            return values[0] if len(values) == 1 else None
        return held
    return None


def _rows(ctx: FileContext, expr: ast.AST) -> int | None:
    """The first dimension of a tensor built in sight (``torch.randn(12, 6)``)."""
    if isinstance(expr, ast.Name):
        name = expr.id
        # (`x = x * mask`: elementwise on the same rows, not another tensor)
        local = [v for v in ctx.assigned_in(ctx.scope_of(expr)).get(name, [])
                 if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(v))]
        if len(local) == 1:
            expr = local[0]  # (`x` of the data helper, whatever other functions call `x`)
        elif not single_assignments(ctx).get(expr.id):
            expr = _unpacked(ctx, expr) or expr
    expr = _single_value(ctx, expr)
    if not isinstance(expr, ast.Call):
        return None
    name = (dotted(expr.func) or "").rsplit(".", 1)[-1]
    if name == "where" and len(expr.args) == 3:  # `torch.where(swap, b, a)`: the rows of its operands
        return _rows(ctx, expr.args[1])
    if name in _DATA_FACTORIES and expr.args:
        first = expr.args[0]
        if isinstance(first, ast.Tuple | ast.List) and first.elts:
            first = first.elts[0]
        return _int(ctx, first) if name != "arange" or len(expr.args) == 1 else None
    if name == "randint":
        size = next((kw.value for kw in expr.keywords if kw.arg == "size"), expr.args[2] if len(expr.args) > 2 else None)
        if isinstance(size, ast.Tuple | ast.List) and size.elts:
            return _int(ctx, size.elts[0])
    return None


def _int(ctx: FileContext, expr: ast.AST | None) -> int | None:
    """:meth:`int_value`, or inside a class the file builds with one argument, the value with each
    ``self.x`` that ``__init__`` sets from a parameter replaced by the constructor call's
    argument (``self.hp["bs"]`` of ``ToyDM(HP)`` is ``HP["bs"]``)."""
    v = ctx.int_through_names(expr) if expr is not None else None
    if v is not None or expr is None:
        return v
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult | ast.Add | ast.Sub | ast.FloorDiv):
        # `BS * NB` rows: arithmetic on integers in sight
        a, b = _int(ctx, expr.left), _int(ctx, expr.right)
        if a is None or b is None or (isinstance(expr.op, ast.FloorDiv) and b == 0):
            return None
        return (a * b if isinstance(expr.op, ast.Mult) else a + b if isinstance(expr.op, ast.Add)
                else a - b if isinstance(expr.op, ast.Sub) else a // b)
    cls = ctx.enclosing(expr, (ast.ClassDef,))
    if not isinstance(cls, ast.ClassDef):
        return None
    binding = _constructor_binding(ctx, cls)
    if not binding:
        return None

    fn = ctx.enclosing(expr, (ast.FunctionDef,))
    in_init = isinstance(fn, ast.FunctionDef) and fn.name == "__init__" \
        and ctx.parents.get(fn) is cls

    class _Sub(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            d = dotted(node)
            return binding.get(d, node) if d is not None else self.generic_visit(node)

        def visit_Name(self, node: ast.Name) -> ast.AST:
            # `cfg["n"]` in `__init__(self, cfg)`: the constructor's argument for it
            return binding.get("__init__:" + node.id, node) if in_init else node

    swapped = _Sub().visit(copy.deepcopy(expr))
    return ctx.int_value(swapped)


def _constructor_binding(ctx: FileContext, cls: ast.ClassDef) -> dict[str, ast.AST]:
    """``{"self.hp": HP}`` for each ``self.x = param`` (also ``self.n, self.bs = n, bs``) of the
    class's ``__init__`` when every construction in the file (``dm = ToyDM(HP)``) passes the
    same name, field (``hp.n``) or literal for it."""
    def compute() -> dict[str, ast.AST]:
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        sites = [c for c in ctx.of(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == cls.name]
        if init is None or not sites:
            return {}
        params = {a.arg for a in (*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs)}
        out: dict[str, ast.AST] = {}
        pairs: list[tuple[ast.AST, ast.AST]] = []
        for n in ast.walk(init):
            if isinstance(n, ast.Assign) and len(n.targets) == 1:
                t, v = n.targets[0], n.value
                if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts):
                    pairs += list(zip(t.elts, v.elts, strict=True))  # `self.n, self.bs = n, bs`
                else:
                    pairs.append((t, v))
        def same(name: str) -> ast.AST | None:
            args = [bound_argument(init, site, name) for site in sites]
            # (every construction passes the same name or literal)
            if all(isinstance(a, ast.Constant) or (isinstance(a, ast.Name | ast.Attribute)
                                                   and dotted(a) is not None) for a in args) \
                    and len({ast.unparse(a) for a in args if a is not None}) == 1:
                return args[0]
            return None

        for target, value in pairs:
            if isinstance(value, ast.Name) and value.id in params \
                    and (d := dotted(target)) is not None and d.startswith("self.") \
                    and (arg := same(value.id)) is not None:
                out[d] = arg
        for name in params - {"self"}:  # the parameters themselves, read in __init__
            if (arg := same(name)) is not None:
                out["__init__:" + name] = arg
        return out
    return ctx._cached("constructor_binding", cls, compute)  # type: ignore[no-any-return]


def _fits(ctx: FileContext) -> dict[str, list[ast.Call]]:
    """``x.fit(...)`` calls by receiver name (one pass, cached)."""
    def compute() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for c in ctx.of(ast.Call):
            if isinstance(c.func, ast.Attribute) and c.func.attr == "fit" and (d := dotted(c.func.value)):
                out.setdefault(d, []).append(c)
        return out
    return ctx._cached("lightning_fits", ctx.tree, compute)  # type: ignore[no-any-return]


def fit_batches(ctx: FileContext, trainer: ast.Call) -> int | None:
    """Batches per epoch of the loader handed to ``trainer.fit(module, loader)`` when all of it
    is in sight: ``DataLoader(TensorDataset(X, ...), batch_size=b)`` (no sampler, ``drop_last``
    as given) over a tensor whose row count is a literal."""
    parent = ctx.parents.get(trainer)
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)):
        return None
    name = parent.targets[0].id

    world = _trainer_world(ctx, trainer)
    if world is None:
        return None

    def compute() -> int | None:  # it depends on the name only: once per name, not per trainer
        counts: set[int | None] = set()
        for fit in _fits(ctx).get(name, []):
            loader: ast.AST | None = next(
                (kw.value for kw in fit.keywords if kw.arg == "train_dataloaders"),
                fit.args[1] if len(fit.args) > 1 else None)
            dm = next((kw.value for kw in fit.keywords if kw.arg == "datamodule"), None)
            if loader is None and dm is not None:
                loader = _datamodule_loader(ctx, dm)
            elif loader is not None:  # (a DataModule passed in the loaders' place: Lightning takes it)
                loader = _datamodule_loader(ctx, loader) or loader
            counts.add(_loader_batches(ctx, loader, world) if loader is not None else None)
        return counts.pop() if len(counts) == 1 else None
    return ctx._cached(f"fit_batches:{name}:{world}", ctx.tree, compute)  # type: ignore[no-any-return]


def _datamodule_loader(ctx: FileContext, dm: ast.AST) -> ast.AST | None:
    """The ``DataLoader(...)`` a DataModule of the file returns from ``train_dataloader``
    (``trainer.fit(model, datamodule=ToyDM(HP))`` or a name assigned that once)."""
    built = _single_value(ctx, dm)
    if not (isinstance(built, ast.Call) and isinstance(built.func, ast.Name)):
        return None
    classes = [c for c in ctx.of(ast.ClassDef) if c.name == built.func.id]
    if len(classes) != 1:
        return None
    method = next((f for f in classes[0].body if isinstance(f, ast.FunctionDef)
                   and f.name == "train_dataloader"), None)
    returns = [r.value for r in ast.walk(method) if isinstance(r, ast.Return)] if method else []
    return returns[0] if len(returns) == 1 else None


def _trainer_world(ctx: FileContext, trainer: ast.Call) -> int | None:
    """The processes each epoch's data is split over: ``devices`` (times ``num_nodes``) as
    integers in sight, 1 without them or with ``use_distributed_sampler=False`` (the loader
    is each process's own); None when a count is given but not in sight (``"auto"``, a list,
    a value from the command line)."""
    kws = {k.arg: k.value for k in trainer.keywords if k.arg is not None}
    own = kws.get("use_distributed_sampler", kws.get("replace_sampler_ddp"))
    if isinstance(own, ast.Constant) and own.value is False:
        return 1
    world = 1
    for key in ("devices", "num_nodes"):
        if key in kws:
            v = ctx.int_value(kws[key])
            if v is None or v < 1:
                return None
            world *= v
    return world


def _loader_batches(ctx: FileContext, loader: ast.AST, world: int = 1) -> int | None:
    """Batches per epoch of one process: Lightning's distributed sampler gives each of
    ``world`` processes ceil(rows / world) rows (it pads the last ones)."""
    loader = _single_value(ctx, loader)
    if not (isinstance(loader, ast.Call) and (dotted(loader.func) or "").endswith("DataLoader") and loader.args):
        return None
    kws = {k.arg: k.value for k in loader.keywords}
    if None in kws or {"sampler", "batch_sampler"} & set(kws):
        return None
    bs = _int(ctx, kws.get("batch_size", loader.args[1] if len(loader.args) > 1 else None))
    drop = kws.get("drop_last")
    ds = _returned_dataset(ctx, _single_value(ctx, loader.args[0]))
    if bs is None or bs <= 0 or not isinstance(ds, ast.Call):
        return None
    if drop is not None and not (isinstance(drop, ast.Constant) and drop.value in (True, False)):
        return None
    own = dataset_class_len(ctx, ds)
    if own is not None:
        rows = _rows(ctx, own[1]) if own[0] == "rows" else _int(ctx, own[1])
    elif (dotted(ds.func) or "").endswith("TensorDataset") and ds.args:
        # (its tensors share their first dimension: the first one whose rows are in sight)
        rows = next((r for a in ds.args if (r := _rows(ctx, a)) is not None), None)
    elif (dotted(ds.func) or "").endswith("Subset") and len(ds.args) == 2:
        rows = static_len(ctx, ds.args[1])  # `Subset(ds, range(a, b))`: its indices
    else:
        return None
    if rows is None:
        return None
    rows = -(-rows // world)
    return rows // bs if drop is not None and drop.value else -(-rows // bs)


def _returned_dataset(ctx: FileContext, ds: ast.AST) -> ast.AST:
    """``make_ds()`` of a function of the file whose one ``return`` is the dataset built
    there (``return TensorDataset(x, y)``): that expression, else ``ds``."""
    if not (isinstance(ds, ast.Call) and isinstance(ds.func, ast.Name) and not ds.args):
        return ds
    defs = ctx.defs_by_name().get(ds.func.id, [])
    if len(defs) != 1:
        return ds
    returns = [n for n in ast.walk(defs[0]) if isinstance(n, ast.Return) and n.value is not None]
    return returns[0].value if len(returns) == 1 and returns[0].value is not None else ds


def _rescales_windows(ctx: FileContext, trainer: ast.Call) -> bool:
    """The module reads the window's size from the Trainer (``self.trainer.accumulate_grad_batches``,
    ``num_training_batches``) outside the ``Trainer(...)`` call: it may scale its short window."""
    inside = set(ast.walk(trainer))
    return any(isinstance(n, ast.Attribute) and n.attr in ("accumulate_grad_batches", "num_training_batches")
               and n not in inside and not _never_called(ctx, n) for n in ast.walk(ctx.tree))


def _never_called(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` is in a helper method of the file (not a Lightning hook) that nothing in the
    file calls by its name: it cannot scale anything."""
    fn = ctx.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name.startswith(
            ("on_", "training_step", "configure_", "backward", "optimizer_", "lr_scheduler")):
        return False
    return not any(call_attr(c) == fn.name for c in ctx.of(ast.Call))


def _schedule_dict(ctx: FileContext, expr: ast.AST) -> ast.Dict | None:
    """The dict literal ``expr`` is: itself, a name assigned it once, or a config entry
    (``HP["accum_schedule"]``)."""
    expr = _single_value(ctx, expr)
    if isinstance(expr, ast.Subscript):
        entry = ctx.dict_entry(expr)
        expr = entry if entry is not None else expr
    return expr if isinstance(expr, ast.Dict) else None


def _epoch_ks(ctx: FileContext, trainer: ast.Call, kws: dict[str, ast.AST]) -> dict[int, int] | None:
    """K of each epoch the run makes, from a ``GradientAccumulationScheduler(scheduling={epoch:
    K})`` in the Trainer's callbacks (Lightning applies the entry of the largest epoch <= e, K
    = 1 before the first); every scheduled epoch when ``max_epochs`` is not in sight."""
    callbacks = _single_value(ctx, kws["callbacks"]) if "callbacks" in kws else None
    if not isinstance(callbacks, ast.List | ast.Tuple):
        return None
    for elt in callbacks.elts:
        cb = _single_value(ctx, elt)
        if not (isinstance(cb, ast.Call)
                and (dotted(cb.func) or "").endswith("GradientAccumulationScheduler")):
            continue
        arg = next((k.value for k in cb.keywords if k.arg == "scheduling"), cb.args[0] if cb.args else None)
        table = _schedule_dict(ctx, arg) if arg is not None else None
        if table is None or any(k is None for k in table.keys):
            return None
        pairs = [(ctx.int_value(e), ctx.int_value(v)) for e, v in zip(table.keys, table.values, strict=True)]
        if any(e is None or v is None for e, v in pairs):
            return None
        schedule = sorted((e, v) for e, v in pairs if e is not None and v is not None)
        epochs = ctx.int_value(kws.get("max_epochs"))
        last = epochs - 1 if epochs is not None else max(e for e, _ in schedule)
        out: dict[int, int] = {}
        for epoch in range(last + 1):
            ks = [v for e, v in schedule if e <= epoch]
            out[epoch] = ks[-1] if ks else 1
        return out
    return None


def _scheduled_tail(ctx: FileContext, trainer: ast.Call, kws: dict[str, ast.AST], n: int) -> Finding | None:
    """AG131 for K set per epoch by ``GradientAccumulationScheduler``: an epoch whose n batches
    are not a multiple of its K ends in a short window still divided by that K."""
    ks = _epoch_ks(ctx, trainer, kws)
    if not ks or _rescales_windows(ctx, trainer):
        return None
    short = {e: k for e, k in ks.items() if k > 1 and n % k}
    if not short:
        return None
    parts = ", ".join(f"epoch {e}: K = {k}, a last window of {n % k} ({n % k}/{k} of its mean "
                      "gradient)" for e, k in sorted(short.items())[:4])
    f = ctx.finding("AG131", trainer, (
        f"the epoch's {n} batches (the training loader, in sight) are not a multiple of the "
        f"K that `GradientAccumulationScheduler` sets for every epoch ({parts}): Lightning steps "
        "the optimizer at each epoch's last batch with each loss still divided by that epoch's K"))
    return f if "max_steps" not in kws and "limit_train_batches" not in kws else replace(
        f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


@rule("AG131")
def lightning_epoch_shorter_than_window(ctx: FileContext) -> Iterator[Finding]:
    if not _imports_lightning(ctx):
        return
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "Trainer":
            continue
        kws = {k.arg: k.value for k in call.keywords if k.arg is not None}
        if any(k.arg is None for k in call.keywords):
            continue
        strategy = kws.get("strategy")
        if strategy is not None and "deepspeed" in ast.unparse(strategy).lower():
            continue  # the DeepSpeed engine accumulates and scales on its own
        n = ctx.int_value(kws["limit_train_batches"]) if "limit_train_batches" in kws else fit_batches(ctx, call)
        k = ctx.int_value(kws.get("accumulate_grad_batches"))
        if k is None and n is not None and n > 0 and "accumulate_grad_batches" not in kws:
            scheduled = _scheduled_tail(ctx, call, kws, n)
            if scheduled is not None:
                yield scheduled
            continue
        if n is None or k is None or k <= 1 or n <= 0 or n % k == 0:
            continue
        r = n % k
        what = f"`limit_train_batches={n}`" if "limit_train_batches" in kws else f"the epoch's {n} batches"
        if n < k:
            verb = "is" if "limit_train_batches" in kws else "are"
            msg = (f"{what} {verb} fewer than `accumulate_grad_batches={k}`: Lightning "
                   f"steps the optimizer at each epoch's last batch, so every window holds at most {n} "
                   f"batches, each loss still divided by {k}: every update is at most {n}/{k} of its window's "
                   "mean gradient, on fewer batches than the large batch")
            yield ctx.finding("AG131", call, msg)
        else:
            if "limit_train_batches" not in kws:
                if _rescales_windows(ctx, call):
                    continue
                world = _trainer_world(ctx, call) or 1
                where = ("the training loader, in sight" if world == 1 else
                         f"per process: the training loader, in sight, split over {world} "
                         "processes by Lightning's distributed sampler")
                tail = ctx.finding("AG131", call, (
                    f"the epoch's {n} batches ({where}) are not a "
                    f"multiple of `accumulate_grad_batches={k}`: Lightning steps the optimizer at "
                    f"each epoch's last batch, so each epoch's last window holds {r} batch{'es' if r > 1 else ''}, each "
                    f"loss still divided by {k} ({r}/{k} of its mean gradient)"))
                # max_steps may end the run before the first epoch's end (never its tail)
                yield tail if "max_steps" not in kws else replace(
                    tail, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                continue
            msg = (f"{what} is not a multiple of `accumulate_grad_batches={k}`: "
                   f"each epoch's last window holds {r} batch{'es' if r > 1 else ''}, stepped at the epoch's end with each "
                   f"loss still divided by {k} ({r}/{k} of its mean gradient), unless the loader has "
                   f"fewer than {n} batches (not in sight)")
            f = ctx.finding("AG131", call, msg)
            yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
