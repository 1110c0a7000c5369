"""AG189 (F10): the training forward runs on the module a data-parallel wrapper was made from.

``fabric.setup(net, opt)``, ``accelerator.prepare(net, ...)`` and ``DDP(net)`` return a new
object that wraps ``net``; DDP reduces the gradients of a backward only when that backward
came from a forward the wrapper ran (it arms its reducer in its own ``forward``). A loop that
keeps calling ``net(x)`` (directly, or through a helper it hands ``net`` to) after binding the
wrapper to another name trains with no reduction at all: each rank steps on its own
gradient. Reported when the raw name is not rebound, the forward on it sits in a loop that
runs a backward, and nothing in the file shards with FSDP (whose wrappers differ).

AG300 (F10): the training forward runs ``ddp.module(x)`` or ``ddp.module.method(...)`` (or a
name bound to ``ddp.module``) instead of the wrapper, in a loop that backwards (or a function
such a loop calls), not under ``no_grad``: the backward reduces nothing.

AG301 (F10): a parameter frozen before ``DDP(net)`` and unfrozen after it (progressive
unfreezing) with no DDP built again: DDP's reducer never holds it. The Lightning form: a
LightningModule freezing a submodule in ``__init__``/``setup``/``configure_model`` (before
Lightning's DDP strategy wraps it) and unfreezing it in a training hook, under a DDP
strategy.

AG196 (F10): a submodule replaced on the wrapped model's inner module after wrapping
(``accelerator.unwrap_model(model).head = nn.Linear(...)``, or through a helper of the file
handed ``unwrap_model(model)`` / ``ddp.module`` that assigns its attribute a new module): DDP
reduces the parameters it registered when it was built, so the new module's gradients are
never averaged over the ranks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, position
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._wrapfacts import (
    in_training_loop,
    mentions_fsdp,
    no_grad,
    trains,
    under_no_grad,
)

__all__ = ["forward_on_the_unwrapped_module", "forward_through_the_inner_module",
           "module_replaced_after_wrapping", "unfrozen_after_ddp_was_built"]

_WRAPPERS = frozenset({"DistributedDataParallel", "DDP"})


def _wraps(ctx: FileContext) -> list[tuple[ast.Call, str, str]]:
    """(wrap call, raw name, wrapper name) of ``w = DDP(net)``, ``m, o = fabric.setup(net, o)``,
    ``m, o, dl = accelerator.prepare(net, o, dl)`` with the wrapper bound to another name."""
    out = []
    for node in ctx.of(ast.Assign):
        call = node.value
        if not (isinstance(node, ast.Assign) and isinstance(call, ast.Call) and call.args
                and len(node.targets) == 1):
            continue
        name = call_attr(call) or ""
        tgt = node.targets[0]
        if name in _WRAPPERS or (dotted(call.func) or "").split(".")[-1] in _WRAPPERS:
            pairs = [(call.args[0], tgt)]
        elif name in ("setup", "prepare", "setup_module") and isinstance(tgt, ast.Tuple) \
                and len(tgt.elts) == len(call.args):
            pairs = list(zip(call.args, tgt.elts, strict=True))
        elif name in ("setup", "prepare", "setup_module") and len(call.args) == 1:
            pairs = [(call.args[0], tgt)]
        else:
            continue
        raw, wrapped = pairs[0]
        if isinstance(raw, ast.Name) and isinstance(wrapped, ast.Name) and raw.id != wrapped.id:
            out.append((call, raw.id, wrapped.id))
    return out


def _calls_param(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef, index: int) -> bool:
    """``fn``'s parameter ``index`` is called in its body (``net(x)``) with gradients on (no
    ``no_grad`` decorator or block around it: a rollout, an evaluation)."""
    args = fn.args.args
    if index >= len(args) or any(no_grad(d) for d in fn.decorator_list):
        return False
    p = args[index].arg
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == p
               and not under_no_grad(ctx, n, fn) for n in ast.walk(fn))


@rule("AG189")
def forward_on_the_unwrapped_module(ctx: FileContext) -> Iterator[Finding]:
    wraps = _wraps(ctx)
    if not wraps or mentions_fsdp(ctx):
        return
    defs = ctx.functions_by_name()
    for wrap, raw, wrapped in wraps:
        scope = ctx.enclosing(wrap, FUNCS) or ctx.tree
        if len(ctx.assigned_in(scope).get(raw, [])) > 1:
            continue  # (rebound: `net = ...` again)
        for call in ast.walk(scope):
            if not isinstance(call, ast.Call) or call.lineno <= wrap.lineno:
                continue
            direct = isinstance(call.func, ast.Name) and call.func.id == raw
            helper = None
            if not direct and isinstance(call.func, ast.Name):
                for i, a in enumerate(call.args):
                    if isinstance(a, ast.Name) and a.id == raw and any(
                            _calls_param(ctx, f, i) for f in defs.get(call.func.id, [])):
                        helper = call.func.id
            if not (direct or helper) or not in_training_loop(ctx, call):
                continue
            yield ctx.finding(
                "AG189",
                call,
                f"`{raw}` was handed to `{ast.unparse(wrap.func)}(...)` (line {wrap.lineno}), "
                f"whose data-parallel wrapper is `{wrapped}`, but the training loop's forward "
                f"runs on `{raw}` itself"
                + (f" (through `{helper}()`)" if helper else "")
                + ": the wrapper's forward never runs, so DDP never reduces the gradients of "
                "these backwards and each rank steps on its own gradient",
            )
            return


def _inner(node: ast.AST) -> bool:
    """``accelerator.unwrap_model(m)``, ``fabric.to_original(...)`` or ``<x>.module``."""
    return (isinstance(node, ast.Call) and call_attr(node) in ("unwrap_model", "_unwrap_model")) \
        or (isinstance(node, ast.Attribute) and node.attr == "module")


def _new_module(value: ast.AST) -> bool:
    """``nn.Linear(...)`` (a class call, maybe ``.to(...)``-ed): a module built here."""
    if isinstance(value, ast.Call) and call_attr(value) == "to" and isinstance(value.func, ast.Attribute):
        value = value.func.value
    return isinstance(value, ast.Call) and (call_attr(value) or "")[:1].isupper()


def _assigns_param_attr(fn: ast.FunctionDef | ast.AsyncFunctionDef, index: int) -> ast.Assign | None:
    args = fn.args.args
    if index >= len(args):
        return None
    p = args[index].arg
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) \
                and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == p \
                and _new_module(n.value):
            return n
    return None


@rule("AG196")
def module_replaced_after_wrapping(ctx: FileContext) -> Iterator[Finding]:
    if mentions_fsdp(ctx):
        return
    defs = ctx.functions_by_name()
    for node in ctx.of(ast.Assign, ast.Call):
        site: ast.AST | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Attribute) and _inner(node.targets[0].value) \
                and _new_module(node.value):
            site = node
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            for i, a in enumerate(node.args):
                if _inner(a) and any(_assigns_param_attr(f, i) for f in defs.get(node.func.id, [])):
                    site = node
        if site is None:
            continue
        yield ctx.finding(
            "AG196",
            site,
            f"`{ast.unparse(site)}` puts a new module into the model after it was wrapped for "
            "data parallelism (through its inner module): DDP reduces only the parameters it "
            "registered when it was built, so the new module's gradients are never averaged "
            "over the ranks and each rank steps it on its own",
            fix="replace the module before accelerator.prepare / DDP(...) wraps the model (and "
                "build the optimizer after), or wrap again",
        )
        return


# ---------------------------------------------------------------- AG300: through `.module`

#: methods of a module that run no forward
_NOT_FORWARD = frozenset({
    "parameters", "named_parameters", "state_dict", "load_state_dict", "train", "eval", "to",
    "cpu", "cuda", "modules", "named_modules", "children", "named_children", "buffers",
    "named_buffers", "zero_grad", "apply", "requires_grad_", "half", "float", "double",
    "bfloat16", "register_forward_hook", "register_forward_pre_hook", "register_buffer",
    "register_parameter", "get_submodule", "get_parameter", "save_pretrained", "generate",
    "resize_token_embeddings", "get_input_embeddings", "get_output_embeddings", "tie_weights",
    "gradient_checkpointing_enable", "extra_repr", "share_memory", "type"})
#: ... and method names that begin so (a model's own setup and bookkeeping)
_NOT_FORWARD_PREFIX = ("configure", "init", "reset", "setup", "build", "save", "load", "log",
                       "print", "num_", "estimate", "get_num", "crop", "set_", "create")


def _ddp_names(ctx: FileContext) -> set[str]:
    """Dotted names bound to a ``DDP(...)`` wrapper (``model``, ``self.model``)."""
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        call = node.value
        if isinstance(call, ast.Call) and (dotted(call.func) or "").split(".")[-1] in _WRAPPERS:
            out |= {d for t in node.targets if (d := dotted(t)) is not None}
    return out


def _inner_of(ctx: FileContext, wrappers: set[str]) -> dict[str, str]:
    """``<w>.module`` for each wrapper, and names assigned from it once
    (``self.policy = self.model.module``, nanoGPT's ``raw_model = model.module if ddp else
    model``), each with the wrapper it bypasses."""
    out = {f"{w}.module": w for w in wrappers}
    for node in ctx.of(ast.Assign):
        v = node.value
        # (only a choice by a flag, `model.module if ddp else model`: one by a test of the
        # micro-step, `ddp if j == n - 1 else ddp.module`, skips the reduction on purpose
        # until the window's last micro-step)
        srcs = ([v.body, v.orelse] if isinstance(v.test, ast.Name | ast.Attribute)
                and not _micro_step_flag(ctx, v.test) else []) \
            if isinstance(v, ast.IfExp) else [v]
        src = next((d for e in srcs if (d := dotted(e)) in out), None)
        if src is not None and len(node.targets) == 1 and (d := dotted(node.targets[0])) is not None \
                and len(ctx.values_by_name().get(d, [])) == 1:
            out[d] = out[src]
    return out


def _micro_step_flag(ctx: FileContext, test: ast.AST) -> bool:
    """``test`` is a name bound to a comparison of a loop's variable (``last = j ==
    len(window) - 1``): a test of the micro-step, not a flag of the run (nanoGPT's ``ddp =
    int(os.environ.get("RANK", -1)) != -1``)."""
    if not isinstance(test, ast.Name):
        return False
    values = ctx.values_by_name().get(test.id, [])
    if not values or not all(isinstance(v, ast.Compare) for v in values):
        return False
    for v in values:
        loop = ctx.enclosing(v, (ast.For, ast.AsyncFor))
        targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} \
            if isinstance(loop, ast.For | ast.AsyncFor) else set()
        if not targets & {n.id for n in ast.walk(v) if isinstance(n, ast.Name)}:
            return False
    return True


def _compiled_inner(ctx: FileContext, inner: dict[str, str]) -> dict[str, tuple[str, ast.Assign]]:
    """Names whose last binding in the file is ``torch.compile(<an inner module>)`` (nanoGPT's
    ``model = torch.compile(raw_model)`` after ``model = DDP(model)``): the compiled module
    is the inner one, so a forward through it after that binding bypasses the wrapper."""
    last: dict[str, ast.Assign] = {}
    for node in ctx.of(ast.Assign):
        if len(node.targets) == 1 and (d := dotted(node.targets[0])) is not None \
                and (d not in last or position(node) > position(last[d])):
            last[d] = node
    out: dict[str, tuple[str, ast.Assign]] = {}
    for name, node in last.items():
        v = node.value
        if isinstance(v, ast.Call) and (dotted(v.func) or "").split(".")[-1] == "compile" \
                and v.args and (src := dotted(v.args[0])) in inner:
            out[name] = (inner[src], node)
    return out


_NOT_MODELS = re.compile(r"opt|loader|sched|data|scaler", re.IGNORECASE)


def _prepared_models(ctx: FileContext) -> set[str]:
    """Names bound to a model ``accelerator.prepare`` returned (``self.model, opt, dl, sched
    = accelerator.prepare(model, opt, dl, sched)``: the targets of the arguments that name
    no optimizer, loader or scheduler)."""
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        call = node.value
        if not (isinstance(call, ast.Call) and call_attr(call) == "prepare"
                and len(node.targets) == 1):
            continue
        tgt = node.targets[0]
        targets = tgt.elts if isinstance(tgt, ast.Tuple) else [tgt]
        if len(targets) != len(call.args):
            continue
        for arg, t in zip(call.args, targets, strict=True):
            a, d = dotted(arg), dotted(t)
            if a and d and not _NOT_MODELS.search(a.split(".")[-1]):
                out.add(d)
    return out


def _unwrapped_of(ctx: FileContext, prepared: set[str]) -> dict[str, str]:
    """Names assigned ``accelerator.unwrap_model(<a prepared model>)`` once, each with the
    prepared model it bypasses."""
    out: dict[str, str] = {}
    for node in ctx.of(ast.Assign):
        v = node.value
        if isinstance(v, ast.Call) and call_attr(v) == "unwrap_model" and v.args \
                and dotted(v.args[0]) in prepared and len(node.targets) == 1 \
                and (d := dotted(node.targets[0])) is not None:
            out[d] = dotted(v.args[0]) or ""
    return out


@rule("AG300")
def forward_through_the_inner_module(ctx: FileContext) -> Iterator[Finding]:
    wrappers = _ddp_names(ctx)
    inner: dict[str, str] = {}
    if ctx.accelerate and not any("deepspeed" in (n.id if isinstance(n, ast.Name) else
                                                   n.attr if isinstance(n, ast.Attribute)
                                                   else "").lower()
                                  for n in ast.walk(ctx.tree)):
        # (under DeepSpeed, Accelerate's backward reduces whatever the forward ran through)
        prepared = _prepared_models(ctx)
        inner.update(_unwrapped_of(ctx, prepared))
        wrappers |= set(inner.values())
    accel = set(inner.values())
    if not wrappers or mentions_fsdp(ctx):
        return
    inner.update(_inner_of(ctx, _ddp_names(ctx)))
    compiled = _compiled_inner(ctx, inner)
    for call in ctx.of(ast.Call):
        func = call.func
        name = dotted(func)
        if name in compiled and position(call) > position(compiled[name][1]):
            if not trains(ctx, call):
                continue
            wrapper, bound = compiled[name]
            yield ctx.finding(
                "AG300", call,
                f"`{name}(...)` runs `{ast.unparse(bound.value)}` (line {bound.lineno}): the "
                f"module inside `{wrapper}` (a DDP wrapper) compiled on its own, in a loop that "
                "runs a backward: DDP arms its gradient reduction only in its own forward, so "
                "the backward of this forward reduces nothing and each rank steps on its own "
                "gradient",
                fix="compile the DDP-wrapped model (`model = torch.compile(model)` after "
                    "`model = DDP(model)`), or wrap the compiled module in DDP")
            continue
        if name in inner:
            via, what = name, f"`{name}(...)`"
        elif isinstance(func, ast.Attribute) and dotted(func.value) in inner \
                and func.attr not in _NOT_FORWARD and not func.attr.startswith(("_", *_NOT_FORWARD_PREFIX)):
            via, what = dotted(func.value) or "", f"`{ast.unparse(func)}(...)`"
        else:
            # handed to a function of the file that calls it (`sequence_logps(self.policy, x)`)
            fn = ctx.callee_of(call)
            at = next((i for i, a in enumerate(call.args) if dotted(a) in inner), None)
            if fn is None or at is None or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            shift = 1 if fn.args.args and fn.args.args[0].arg in ("self", "cls") \
                and isinstance(func, ast.Attribute) else 0
            if not _calls_param(ctx, fn, at + shift) or any(
                    isinstance(c, ast.Call) and ((dotted(c.func) or "").endswith("autograd.grad")
                                                 or call_attr(c) == "zero_grad")
                    for c in ctx.local_nodes(fn)):
                continue  # (a probe: torch.autograd.grad, or a gradient it clears itself)
            via = dotted(call.args[at]) or ""
            what = f"`{ast.unparse(call.func)}(...)`, which calls the `{via}` it is handed,"
        wrapper = inner[via]
        if not trains(ctx, call) or _frozen_at(ctx, call, {via, wrapper}):
            continue
        yield ctx.finding(
            "AG300", call,
            f"{what} runs the module inside `{wrapper}` ("
            + ("the model `accelerator.prepare` wrapped: DDP on several processes"
               if wrapper in accel else "a DDP wrapper")
            + ") directly, in a loop that "
            "runs a backward: DDP arms its gradient reduction only in its own forward, so the "
            "backward of this forward reduces nothing and each rank steps on its own gradient")


def _frozen_at(ctx: FileContext, call: ast.Call, names: set[str]) -> bool:
    """The last freeze or unfreeze of one of ``names`` (``D.module.requires_grad_(False)``, or
    ``p.requires_grad = False`` in a loop over its ``parameters()``) before ``call`` in
    its function freezes it: the module holds no gradient to reduce there (a GAN's
    generator step through the frozen discriminator)."""
    fn = ctx.enclosing(call, FUNCS) or ctx.tree
    last: tuple[int, bool] | None = None
    for node in ast.walk(fn):
        if getattr(node, "lineno", call.lineno) >= call.lineno:
            continue
        got = _freezes(node)
        if got is None:
            continue
        target, on = got
        if target not in names:
            loop = ctx.parents.get(node)
            while loop is not None and not isinstance(loop, ast.For | FUNCS):
                loop = ctx.parents.get(loop)
            if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
                    and loop.target.id == target and isinstance(loop.iter, ast.Call)
                    and call_attr(loop.iter) in ("parameters", "named_parameters")
                    and isinstance(loop.iter.func, ast.Attribute)
                    and dotted(loop.iter.func.value) in names):
                continue
        line = int(getattr(node, "lineno", 0))
        if last is None or line > last[0]:
            last = (line, on)
    return last is not None and not last[1]


# ---------------------------------------------------------------- AG301: unfrozen after DDP

def _freezes(node: ast.AST) -> tuple[str, bool] | None:
    """``X.requires_grad_(False)`` / ``X.requires_grad = False`` (and True): (X, on)."""
    if isinstance(node, ast.Call) and call_attr(node) == "requires_grad_" \
            and isinstance(node.func, ast.Attribute):
        arg = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "requires_grad"), ast.Constant(True))
        if isinstance(arg, ast.Constant) and isinstance(arg.value, bool):
            target = dotted(node.func.value)
            return (target, arg.value) if target else None
    if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            and isinstance(node.targets[0], ast.Attribute) \
            and node.targets[0].attr == "requires_grad" \
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool):
        target = dotted(node.targets[0].value)
        return (target, node.value.value) if target else None
    return None


def _loop_owner(ctx: FileContext, node: ast.AST, target: str) -> str:
    """``target`` as the parameters of a module when it is the loop variable of ``for p in
    X.parameters()`` / ``for name, p in X.named_parameters()`` around ``node``: ``X.*``;
    else ``target``."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, ast.For) and isinstance(cur.iter, ast.Call) \
                and call_attr(cur.iter) in ("parameters", "named_parameters") \
                and isinstance(cur.iter.func, ast.Attribute) \
                and target in {dotted(t) for t in ast.walk(cur.target) if isinstance(t, ast.Name)} \
                and (owner := dotted(cur.iter.func.value)):
            return owner + ".*"
        cur = ctx.parents.get(cur)
    return target


@rule("AG301")
def unfrozen_after_ddp_was_built(ctx: FileContext) -> Iterator[Finding]:
    """A parameter (or module) frozen before ``DDP(net)`` and unfrozen after it, with no
    DDP built again after the unfreeze: DDP's reducer holds the parameters that required a
    gradient when it was built."""
    if mentions_fsdp(ctx):
        return
    wraps = [(n.value, dotted(n.value.args[0])) for n in ctx.of(ast.Assign)
             if isinstance(n.value, ast.Call) and n.value.args
             and (dotted(n.value.func) or "").split(".")[-1] in _WRAPPERS]
    if not wraps:
        return
    toggles = [(n, (_loop_owner(ctx, n, got[0]), got[1]))
               for n in ctx.of(ast.Call, ast.Assign) if (got := _freezes(n))]
    # `p.requires_grad_(name.startswith("head."))` over a model's parameters: some frozen
    toggles += [(n, (owner, False)) for n in ctx.of(ast.Call)
                if call_attr(n) == "requires_grad_" and isinstance(n.func, ast.Attribute)
                and n.args and not isinstance(n.args[0], ast.Constant)
                and (owner := _loop_owner(ctx, n, dotted(n.func.value) or "")).endswith(".*")]
    for wrap, raw in wraps:
        if raw is None:
            continue
        frozen = {t for n, (t, on) in toggles if not on and t.startswith(raw + ".")
                  and position(n) < position(wrap)}
        for node, (target, on) in toggles:
            if not on or target not in frozen or position(node) <= position(wrap):
                continue
            rewrapped = any(position(w) > position(node) and r == raw for w, r in wraps)
            if rewrapped:
                continue
            head = (f"parameters of `{target[:-2]}` frozen before `{ast.unparse(wrap)}` "
                    f"(line {wrap.lineno}) are unfrozen here" if target.endswith(".*") else
                    f"`{target}` was frozen before `{ast.unparse(wrap)}` (line {wrap.lineno}) "
                    "and is unfrozen here")
            yield ctx.finding(
                "AG301", node,
                f"{head}, with no DDP built again after: DDP's reducer holds the "
                "parameters that required a gradient when it was built, so their "
                "gradient is never averaged over the ranks and each rank steps them on its own")


#: LightningModule methods that run before the DDP strategy wraps the module
_BEFORE_WRAP = frozenset({"__init__", "setup", "configure_model", "prepare_data"})
#: training-time hooks (the module is wrapped by then)
_TRAINING_HOOKS = frozenset({"on_train_epoch_start", "on_train_batch_start", "training_step",
                             "on_train_epoch_end", "on_validation_epoch_end",
                             "on_train_batch_end", "on_before_backward"})


def _lightning_ddp(ctx: FileContext) -> bool:
    """The file's Trainer runs a DDP strategy (``strategy="ddp..."`` or ``DDPStrategy``)."""
    for c in ctx.of(ast.Call):
        if (dotted(c.func) or "").split(".")[-1] != "Trainer":
            continue
        for kw in c.keywords:
            v = kw.value
            if kw.arg == "strategy" and (
                    (isinstance(v, ast.Constant) and isinstance(v.value, str)
                     and v.value.startswith("ddp"))
                    or (isinstance(v, ast.Call) and (dotted(v.func) or "").endswith("DDPStrategy"))):
                return True
    return False


@rule("AG301")
def lightning_unfrozen_after_wrap(ctx: FileContext) -> Iterator[Finding]:
    """The Lightning form of AG301 (see the module)."""
    if mentions_fsdp(ctx) or not _lightning_ddp(ctx):
        return
    for cls in ctx.of(ast.ClassDef):
        if not isinstance(cls, ast.ClassDef) or not any(
                (dotted(b) or "").endswith("LightningModule") for b in cls.bases):
            continue
        frozen: dict[str, str] = {}
        later: list[tuple[ast.AST, str, str]] = []
        for fn in cls.body:
            if not isinstance(fn, FUNCS):
                continue
            for n in ast.walk(fn):
                got = _freezes(n)
                if got is None or not got[0].startswith("self."):
                    continue
                target, on = got
                if not on and fn.name in _BEFORE_WRAP:
                    frozen.setdefault(target, fn.name)
                elif on and fn.name in _TRAINING_HOOKS:
                    later.append((n, target, fn.name))
        for node, target, hook in later:
            if target not in frozen:
                continue
            yield ctx.finding(
                "AG301", node,
                f"`{target}` is frozen in `{cls.name}.{frozen[target]}`, which Lightning runs "
                f"before its DDP strategy wraps the module, and unfrozen here in `{hook}`: "
                "DDP's reducer holds the parameters that required a gradient when it was "
                "built, so this one's gradient is never averaged over the ranks and each rank "
                "steps it on its own")
            break
