"""A submodule assigned to the model itself after DDP wrapped it (F10): AG196, beside
:mod:`.wrapbypass`'s form of it (through the wrapper's ``.module``).

``DistributedDataParallel(model)`` builds its reducer from the parameters the model holds at
that moment. A submodule set on the model afterwards (``model.head = nn.Linear(...)``: a new
task head for fine-tuning, a resized embedding) brings parameters DDP never registered: the
optimizer steps them on each rank's own gradient and the ranks' copies drift apart (DDP's
``find_unused_parameters=True`` also keeps the replaced module from raising).

Also through a method of the model's own class that sets a new module on ``self``
(``model.resize_token_embeddings(n)``, ``model.grow_vocab(n)``) called after ``DDP(model)`` or
``fully_shard(model)`` (FSDP2 leaves the new parameters plain tensors on every rank).

Under a data-parallel ``Fabric`` the wrap is ``fabric.setup(model, ...)`` (``student.hint =
nn.Linear(...)`` after it: the same); under FSDP2 it is ``fully_shard(model)``, which manages
the parameters the module holds then (a head set afterwards stays a plain tensor on each
rank, its gradient never reduced), unless the new module is sharded itself afterwards.

Reported on the assignment when it runs after the wrap: below it in the same function, in
another method of the class whose ``__init__`` wraps, or in a method called on the same
object after the method that wraps (``trainer.wrap(); trainer.reset_head(5)``). Silent when
the model is wrapped again after the assignment, or when the script reduces gradients by
hand.

AG356 (F10): a ``LightningModule`` that creates a parameter or a submodule in
``configure_optimizers`` (``self.log_tau = nn.Parameter(...)``) under a data-parallel
``Trainer`` (several devices, or a DDP strategy). Lightning's DDP strategy wraps the module
before it calls ``configure_optimizers``: DDP never registered what is made there, and each
rank steps it on its own gradient.

AG366 (F10): ``model.load_state_dict(state, assign=True)`` (a warm start from an mmap-ed
checkpoint) after ``DDP(model)``: assign=True swaps the loaded tensors in for the
parameters, which DDP never registered. (FSDP2 re-registers them in a post-load hook.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import DDP_WRAPPERS, FUNCS, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._parallel import multi_device
from accumguard.static.lint.families.unreduced import reduces_grads_by_hand

__all__ = ["made_in_configure_optimizers", "module_replaced_by_a_model_method_after_wrap", "module_set_after_ddp",
           "parameters_assigned_after_wrap"]

_DDP = frozenset({"DistributedDataParallel", "DDP"})


def _wraps(ctx: FileContext) -> list[tuple[ast.Call, str]]:
    """``DDP(model, ...)`` calls with the wrapped model's dotted name, and
    ``fabric.setup(model, ...)`` / ``fabric.setup_module(model)`` under a data-parallel
    ``Fabric`` (its DDP wraps the module as it is then)."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    fabrics = [c for c in calls if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Fabric"]
    fabric_ddp = bool(fabrics) and all(multi_device(c) for c in fabrics)
    out = []
    for c in calls:
        name = (dotted(c.func) or "").rsplit(".", 1)[-1]
        if name in _DDP and name in DDP_WRAPPERS and c.args and (d := dotted(c.args[0])) or fabric_ddp and name in ("setup", "setup_module") and "fabric" in (dotted(c.func) or "").lower() \
                and c.args and (d := dotted(c.args[0])):
            out.append((c, d))
        elif name == "fully_shard" and c.args and (d := dotted(c.args[0])):
            out.append((c, d))  # FSDP2 manages the parameters the module holds at the call
    return out


def _module_ctor(ctx: FileContext, value: ast.AST) -> bool:
    """``nn.Linear(...)``, ``torch.nn.Embedding(...)``, or a class of the file that subclasses
    an ``nn`` module."""
    if not isinstance(value, ast.Call):
        return False
    name = dotted(value.func) or ""
    if name.startswith(("nn.", "torch.nn.")) and name.rsplit(".", 1)[-1][:1].isupper():
        return True
    cls = next((c for c in ctx.of(ast.ClassDef) if c.name == name), None)
    return cls is not None and any("Module" in (dotted(b) or "") for b in cls.bases)


def _method_calls(ctx: FileContext, fn: ast.AST) -> list[tuple[str, ast.AST | None, int]]:
    """(receiver, enclosing function, line) of every ``obj.method(...)`` call in the file
    whose method is ``fn``'s name (the file's calls indexed by method name once)."""
    def index() -> dict[str, list[tuple[str, ast.AST | None, int]]]:
        out: dict[str, list[tuple[str, ast.AST | None, int]]] = {}
        for c in ctx.of(ast.Call):
            if isinstance(c.func, ast.Attribute):
                out.setdefault(c.func.attr, []).append(
                    (dotted(c.func.value) or "", ctx.enclosing(c, FUNCS), c.lineno))
        return out
    table: dict[str, list[tuple[str, ast.AST | None, int]]] = ctx._cached(
        "latemodule_method_calls", ctx.tree, index)
    return table.get(getattr(fn, "name", ""), [])


def _runs_after(ctx: FileContext, node: ast.AST, wrap: ast.Call) -> bool:
    """``node`` runs after ``wrap``: below it in one function; in another method of the class
    whose ``__init__`` wraps; or in a method called on an object after a call of the
    wrapping method on that same object, in one function, with no call of the wrapping
    method after it there (a wrap again)."""
    fn, wfn = ctx.enclosing(node, FUNCS), ctx.enclosing(wrap, FUNCS)
    if fn is wfn:
        return getattr(node, "lineno", 0) > wrap.lineno
    cls, wcls = ctx.enclosing(node, (ast.ClassDef,)), ctx.enclosing(wrap, (ast.ClassDef,))
    if cls is None or cls is not wcls or not isinstance(fn, ast.FunctionDef) \
            or not isinstance(wfn, ast.FunctionDef):
        return False
    if wfn.name == "__init__":
        return fn.name != "__init__"
    wrap_calls = _method_calls(ctx, wfn)
    for recv, where, line in _method_calls(ctx, fn):
        before = [ln for r, w, ln in wrap_calls if r == recv and w is where and ln < line]
        again = [ln for r, w, ln in wrap_calls if r == recv and w is where and ln > line]
        if before and not again:
            return True
    return False


@rule("AG196")
def module_set_after_ddp(ctx: FileContext) -> Iterator[Finding]:
    wraps = _wraps(ctx)
    if not wraps or reduces_grads_by_hand(ctx):
        return
    for node in ctx.of(ast.Assign):
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Attribute) \
                or not _module_ctor(ctx, node.value):
            continue
        owner = dotted(node.targets[0].value) or ""
        for wrap, model in wraps:
            if owner not in (model, f"{model}.module") or not _runs_after(ctx, node, wrap):
                continue
            target = ast.unparse(node.targets[0])
            if any(m in (model, target) and _runs_after(ctx, w, node) for w, m in wraps if w is not wrap):
                continue  # wrapped again after the new module (or the new module sharded itself)
            fsdp = "fully_shard" in ast.unparse(wrap.func)
            by = ("FSDP2" if fsdp else "Fabric's DDP" if "setup" in ast.unparse(wrap.func)
                  else "DDP's reducer")
            yield ctx.finding(
                "AG196", node,
                f"`{ast.unparse(node.targets[0])}` gets a new "
                f"`{(dotted(node.value.func) or 'module').rsplit('.', 1)[-1] if isinstance(node.value, ast.Call) else 'module'}`"
                f" after `{ast.unparse(wrap.func)}({model}, ...)` (line {wrap.lineno}) wrapped "
                f"the model: {by} {'manages' if fsdp else 'holds'} the parameters the model had then, so this "
                "module's gradients are never averaged over the ranks and each rank steps it on "
                "its own",
                fix="set the new module before the wrap (DDP(...), fabric.setup(...)) (and build the optimizer "
                    "after), or wrap again",
            )
            break


def _replacing_methods(ctx: FileContext) -> dict[str, str]:
    """Methods of the file's ``nn.Module`` classes that set a new module on ``self``
    (``self.embed = new`` with ``new = nn.Embedding(...)`` in the method, or ``self.embed,
    self.lm_head = new_e, new_h``) or a new parameter below it (nanoGPT's
    ``self.transformer.wpe.weight = nn.Parameter(...)``): method name -> what it sets."""
    def compute() -> dict[str, str]:
        out: dict[str, str] = {}
        for cls in ctx.of(ast.ClassDef):
            if not any("Module" in (dotted(b) or "") for b in cls.bases):
                continue
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
                    continue
                made = {t.id for a in ast.walk(fn) if isinstance(a, ast.Assign)
                        and _module_ctor(ctx, a.value)
                        for t in a.targets if isinstance(t, ast.Name)}
                for a in ast.walk(fn):
                    if not isinstance(a, ast.Assign) or len(a.targets) != 1:
                        continue
                    t, v = a.targets[0], a.value
                    pairs = list(zip(t.elts, v.elts, strict=False)) \
                        if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
                    for tt, vv in pairs:
                        if isinstance(tt, ast.Attribute) and dotted(tt.value) == "self" and (
                                _module_ctor(ctx, vv) or (isinstance(vv, ast.Name) and vv.id in made)):
                            out.setdefault(fn.name, f"module on the model (`self.{tt.attr}`)")
                        elif isinstance(tt, ast.Attribute) and (dotted(tt.value) or "").startswith("self.") \
                                and _new_parameter(vv):
                            # nanoGPT's crop_block_size: `self.transformer.wpe.weight =
                            # nn.Parameter(...)`, a parameter the wrapper never registered
                            out.setdefault(fn.name, f"parameter on the model (`{dotted(tt)}`)")
        return out
    return ctx._cached("latemodule_replacing", ctx.tree, compute)  # type: ignore[no-any-return]


def _called_after(ctx: FileContext, call: ast.Call, wrap: ast.Call) -> bool:
    """``call`` runs after ``wrap``: below it in one function, or in a method of the class
    whose method wraps that the wrapping method calls below the wrap (``self.grow_vocab()``
    after ``fully_shard(self.model)`` in ``__init__``); a method the wrapping one calls only
    before the wrap does not."""
    fn, wfn = ctx.enclosing(call, FUNCS), ctx.enclosing(wrap, FUNCS)
    if fn is wfn:
        return call.lineno > wrap.lineno
    if isinstance(fn, ast.FunctionDef) and isinstance(wfn, ast.AST):
        lines = [c.lineno for c in ctx.local_nodes(wfn) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and c.func.attr == fn.name
                 and dotted(c.func.value) == "self"]
        if lines:
            return any(ln > wrap.lineno for ln in lines)
    return _runs_after(ctx, call, wrap)


@rule("AG196")
def module_replaced_by_a_model_method_after_wrap(ctx: FileContext) -> Iterator[Finding]:
    """AG196 through a method of the model's own class (``model.resize_token_embeddings(n)``
    setting ``self.embed = nn.Embedding(...)``) called after ``DDP(model)`` or
    ``fully_shard(model)``: the new module's parameters are not in DDP's reducer, nor in any
    FSDP2 unit (plain tensors on each rank), so nothing averages their gradients."""
    methods = _replacing_methods(ctx)
    if not methods or reduces_grads_by_hand(ctx):
        return
    wraps = [(c, d) for c in ctx.of(ast.Call)
             if (dotted(c.func) or "").rsplit(".", 1)[-1] in _DDP | {"fully_shard"}
             and c.args and (d := dotted(c.args[0]))]
    for call in ctx.of(ast.Call):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr in methods):
            continue
        recv = dotted(call.func.value) or ""
        for wrap, model in wraps:
            if recv != model or not _called_after(ctx, call, wrap):
                continue
            if any(m == model and _called_after(ctx, w, call) for w, m in wraps if w is not wrap):
                continue  # wrapped again after the new module
            what = "DDP's reducer holds the parameters the model had then" if "fully_shard" \
                not in ast.unparse(wrap.func) else "FSDP2 sharded the parameters the model had then (the new ones are plain tensors on each rank)"
            yield ctx.finding(
                "AG196", call,
                f"`{ast.unparse(call.func)}(...)` sets a new {methods[call.func.attr]} "
                f"after `{ast.unparse(wrap.func)}({model}, ...)` "
                f"(line {wrap.lineno}) wrapped it: {what}, so the new one's gradients are "
                "never averaged over the ranks and each rank steps it on its own",
                fix="grow or replace the module before wrapping the model (and build the "
                    "optimizer after), or wrap again",
            )
            return


def _new_parameter(value: ast.AST) -> bool:
    """``nn.Parameter(...)`` / ``torch.nn.Parameter(...)``."""
    return isinstance(value, ast.Call) and (dotted(value.func) or "").rsplit(".", 1)[-1] == "Parameter"


@rule("AG356")
def made_in_configure_optimizers(ctx: FileContext) -> Iterator[Finding]:
    trainers = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Trainer"]
    if not trainers or not all(multi_device(c) for c in trainers) or reduces_grads_by_hand(ctx) \
            or any("deepspeed" in ast.unparse(k.value).lower() for c in trainers for k in c.keywords
                   if k.arg == "strategy"):
        return  # (DeepSpeed's strategy builds its engine from configure_optimizers' result)
    for fn in ctx.of(ast.FunctionDef):
        if not isinstance(fn, ast.FunctionDef) or fn.name != "configure_optimizers":
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(t := node.targets[0], ast.Attribute)
                    and dotted(t.value) == "self"
                    and (_new_parameter(node.value) or _module_ctor(ctx, node.value))):
                continue
            yield ctx.finding(
                "AG356", node,
                f"`{ast.unparse(node.targets[0])}` is created in configure_optimizers: under a "
                "data-parallel Trainer, Lightning's DDP strategy wraps the module before it "
                "calls configure_optimizers, so DDP never registered this "
                + ("parameter" if _new_parameter(node.value) else "module's parameters")
                + " and each rank steps it on its own gradient",
                fix="create it in __init__ (or setup), before the strategy wraps the module")
            return


def _wrapped_names(ctx: FileContext) -> list[tuple[ast.Call, set[str]]]:
    """Each ``DDP(...)`` call with the names the wrapped model goes by:
    its argument's, and the name the wrapper is assigned to with its ``.module``
    (``self.model = DDP(Net(cfg))``: ``self.model``, ``self.model.module``)."""
    out = []
    for c in ctx.of(ast.Call):
        if (dotted(c.func) or "").rsplit(".", 1)[-1] not in _DDP or not c.args:
            continue
        names = {d} if (d := dotted(c.args[0])) else set()
        parent = ctx.parents.get(c)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 \
                and (t := dotted(parent.targets[0])):
            names |= {t, f"{t}.module"}
        if names:
            out.append((c, names))
    return out


@rule("AG366")
def parameters_assigned_after_wrap(ctx: FileContext) -> Iterator[Finding]:
    """AG366 (F10): ``load_state_dict(state, assign=True)`` on a model after ``DDP(...)``
    wrapped it. ``assign=True`` puts the checkpoint's tensors in place of the model's
    parameters (it does not copy into them): DDP's reducer keeps the old ones, and the new
    ones, which the forward uses and an optimizer built after steps, are averaged by nothing.
    Not FSDP2: ``fully_shard`` re-registers what ``load_state_dict(assign=True)`` puts in
    place (a post-load hook; the meta-device initialisation loads DTensors that way)."""
    if reduces_grads_by_hand(ctx):
        return
    wraps = _wrapped_names(ctx)
    for call in ctx.of(ast.Call):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "load_state_dict"
                and any(k.arg == "assign" and isinstance(k.value, ast.Constant)
                        and k.value.value is True for k in call.keywords)):
            continue
        recv = dotted(call.func.value) or ""
        for wrap, names in wraps:
            if recv not in names or not _called_after(ctx, call, wrap):
                continue
            if any(names & n and _called_after(ctx, w, call) for w, n in wraps if w is not wrap):
                continue  # wrapped again after the load
            yield ctx.finding(
                "AG366", call,
                f"`{ast.unparse(call.func)}(..., assign=True)` runs after "
                f"`{ast.unparse(wrap.func)}(...)` (line {wrap.lineno}) wrapped the model: "
                "assign=True puts the loaded tensors in place of the parameters instead of "
                "copying into them, so DDP's reducer keeps hooking the old parameters, and the "
                "new ones the forward uses are never averaged over the ranks: "
                "each rank steps them on its own gradient",
                fix="drop assign=True (copy into the wrapped parameters), or load with "
                    "assign=True before wrapping the model and build the optimizer after",
            )
            return
