"""Parameters the ranks' gradient reduction never covers (F10): each rank steps them on its
own gradient, so the ranks' copies drift apart and none follows the large batch.

AG179: a hand-written all-reduce iterating over one parameter group
(``for p in opt.param_groups[0]["params"]: dist.all_reduce(p.grad)``) in a file that builds
an optimizer from two or more groups (a list of ``{"params": ...}`` dicts): the other groups
(typically the no-decay biases, norms and embeddings) are never averaged.

AG180: a module of the file's own that holds an ``nn.Parameter`` (a CLIP loss's learnable
temperature, a learned loss weighting), or a bare ``nn.Parameter`` made outside any module (on
a trainer object), never given to the DDP/FSDP wrapper nor to another module, that an
optimizer steps, in a file that wraps a model for data parallelism (DDP, FSDP, a DeepSpeed
engine: under ZeRO 1-3 unless that optimizer or those parameters are given to
``deepspeed.initialize``) and all-reduces no gradient by hand: the wrapper averages the
gradients of the module it wraps only.

AG183: the parameters of a hand-written reduction held in a generator that the gathering loop
consumes before the loop writing the reduced values back iterates it (zero times).

AG185: a hand-written reduction iterating a list built once from the parameters that
required a gradient then (``[p for p in model.parameters() if p.requires_grad]``), in a file
whose training loop later turns ``requires_grad`` on (an unfreeze at step N): the unfrozen
parameters train on each rank's own gradient.

AG195: the loop writing reduced gradients back assigns them to its own loop variable
(``for g, synced in zip(grads, unflatten(flat, grads)): g = synced``): rebinding the name
writes nothing into the gradient, which stays each rank's own.

AG193: inside a loop over the parameters, a hand-written all-reduce reduces a new tensor made
from the gradient (``g = p.grad / world_size``, ``p.grad.clone()``) and nothing writes it back
into ``.grad``: the gradient the optimizer steps is each rank's own.

AG357: a tensor that requires a gradient but is not a parameter (a buffer registered with
``requires_grad=True``, a learned temperature FSDP2 would not take as a 0-d parameter; a plain
tensor attribute of a module) in a data-parallel file that reduces no gradient by hand: the
wrappers reduce parameters' gradients only, so each rank steps its own copy.

AG359: ``DDP._set_params_and_buffers_to_ignore_for_model(model, names)`` given names taken
from ``named_parameters()`` with no ``requires_grad`` filter: DDP neither broadcasts nor
reduces what it ignores, so the trainable ones among them train on each rank's own gradient.

AG363: the file's only DDP/FSDP wrap is of a submodule put back in place (``net.backbone =
DDP(net.backbone)``) while an optimizer steps a larger module's parameters: the rest of that
module trains on each rank's own gradient (a warning when the file freezes something).

AG337: a parameter given to ``fully_shard(..., ignored_params=...)`` (a learned temperature
FSDP2 refuses to shard) that no hand all-reduce of the file averages: FSDP2 leaves it alone,
so each rank steps its own copy on its own gradient. A reduction whose tensor cannot be told
apart (a loop over every parameter) counts as covering it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import (
    DDP_WRAPPERS,
    OPTIMIZER_CLASSES,
    call_attr,
    dotted,
    last_part,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._parallel import data_parallel

__all__ = ["copy_reduced_not_written_back", "fsdp_ignored", "fsdp_ignored_params_never_reduced", "loop_variable_rebound", "generator_spent_before_write_back", "list_built_before_unfreeze",
           "module_outside_the_wrapper", "grad_tensor_outside_the_reduction", "trained_parameters_ignored_by_ddp", "submodule_wrapped_in_place",
           "outside_modules", "reduce_over_one_group", "reduces_an_outside_module"]

_REDUCERS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
                       "reduce_scatter_tensor"})


def _one_group(it: ast.AST) -> ast.AST | None:
    """The ``X.param_groups[<int>]`` of ``X.param_groups[<int>]["params"]``, else None."""
    if not (isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Constant)
            and it.slice.value == "params"):
        return None
    grp = it.value
    if isinstance(grp, ast.Subscript) and isinstance(grp.slice, ast.Constant) \
            and isinstance(grp.slice.value, int) and isinstance(grp.value, ast.Attribute) \
            and grp.value.attr == "param_groups":
        return grp
    return None


def _reduces_grad_of(body: list[ast.stmt], var: str) -> bool:
    """A reduction in ``body`` of ``<var>.grad`` (or of ``var`` itself)."""
    for stmt in body:
        for n in walk_all(stmt):
            if not (isinstance(n, ast.Call) and call_attr(n) in _REDUCERS and n.args):
                continue
            arg = dotted(n.args[0]) or ""
            if arg in (f"{var}.grad", f"{var}.grad.data", var):
                return True
    return False


def _several_groups(ctx: FileContext) -> bool:
    """The file builds a list of two or more parameter-group dicts (``{"params": ...}``)."""
    for d in ctx.of(ast.Dict):
        lst = ctx.parents.get(d)
        if not isinstance(lst, ast.List):
            continue
        groups = [e for e in lst.elts if isinstance(e, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "params" for k in e.keys)]
        if len(groups) >= 2:
            return True
    return False


@rule("AG179")
def reduce_over_one_group(ctx: FileContext) -> Iterator[Finding]:
    if not _several_groups(ctx):
        return
    for loop in ctx.of(ast.For):
        grp = _one_group(loop.iter)
        if grp is None or not isinstance(loop.target, ast.Name) \
                or not _reduces_grad_of(loop.body, loop.target.id):
            continue
        yield ctx.finding(
            "AG179",
            loop,
            f"the gradients are all-reduced over `{ast.unparse(grp)}` only, while the "
            "optimizer is built from several parameter groups: the other groups' gradients "
            "are never averaged over the ranks, so each rank steps them on its own gradient",
        )
        return


def _param_classes(ctx: FileContext) -> set[str]:
    """Classes of the file (nn.Module subclasses) that assign an ``nn.Parameter`` to an
    attribute of ``self``."""
    out = set()
    for cls in ctx.of(ast.ClassDef):
        if not any("Module" in (dotted(b) or "") for b in cls.bases):
            continue
        for n in walk_all(cls):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) \
                    and last_part(dotted(n.value.func)) == "parameter" \
                    and any((dotted(t) or "").startswith("self.") for t in n.targets):
                out.add(cls.name)
                break
    return out


def _mentions(node: ast.AST, ref: str) -> bool:
    return any(dotted(n) == ref for n in walk_all(node))


def _stepped_by_optimizer(ctx: FileContext, ref: str, bare: bool = False) -> ast.Call | None:
    """An optimizer constructor given ``ref``'s parameters (``ref.parameters()``, or a
    parameter of it; ``ref`` itself when it is a bare parameter), directly or through a name
    assigned in the same function, or an ``add_param_group`` given it."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        callee = dotted(call.func) or ""
        if not (last_part(callee).lower() in OPTIMIZER_CLASSES
                or (bare and call_attr(call) == "add_param_group")) or not call.args:
            continue
        arg = call.args[0]
        sources: list[ast.AST] = [arg]
        if isinstance(arg, ast.Name):
            scope = ctx.scope_of(call)
            sources += ctx.assigned_in(scope).get(arg.id, [])
        for src in sources:
            for n in walk_all(src):
                d = dotted(n) or ""
                if (d.startswith(ref + ".") and d != ref + ".to") or (bare and d == ref):
                    return call
    return None


def _in_module_class(ctx: FileContext, node: ast.AST) -> bool:
    cls = ctx.enclosing(node, (ast.ClassDef,))
    return isinstance(cls, ast.ClassDef) and any("Module" in (dotted(b) or "") for b in cls.bases)


def _handed_to_initialize(ctx: FileContext, call: ast.Call, ref: str, opt: ast.Call) -> bool:
    """Under ZeRO 1-3 the engine reduces what its own optimizer holds: the outside
    parameters count as covered when their optimizer, or a name built from ``ref``, is given
    to ``deepspeed.initialize``."""
    given = [a for a in [*call.args, *(k.value for k in call.keywords)]]
    owner = ctx.parents.get(opt)
    opt_names = {dotted(t) for t in owner.targets} if isinstance(owner, ast.Assign) else set()
    for a in given:
        if a is opt or dotted(a) in opt_names:
            return True
        values: list[ast.AST] = [a]
        if isinstance(a, ast.Name):
            values += ctx.assigned_in(ctx.scope_of(call)).get(a.id, [])
        if any((dotted(n) or "").startswith(ref) for v in values for n in walk_all(v)):
            return True
    return False


def _given_away(ctx: FileContext, ref: str) -> bool:
    """``ref`` passed bare to a call (a wrapper, another module's constructor, a
    ``prepare``) or assigned as an attribute of another object (``model.weighting = ref``,
    which registers it as a submodule): it may then live inside what the wrapper averages."""
    for call in ctx.of(ast.Call):
        args = [*call.args, *(k.value for k in call.keywords)]
        if any(dotted(a) == ref for a in args):
            return True
    return any(dotted(n.value) == ref and any(isinstance(t, ast.Attribute) and dotted(t) != ref
                                              for t in n.targets) for n in ctx.of(ast.Assign))


def _reduces_by_hand(ctx: FileContext) -> bool:
    for call in ctx.of(ast.Call):
        if call_attr(call) in _REDUCERS and call.args and ".grad" in ast.unparse(call.args[0]):
            return True
        if call_attr(call) in _REDUCERS and call.args \
                and "grad" in (last_part(dotted(call.args[0])) or "").lower():
            return True
    return False


def _zero0_initialize(ctx: FileContext, call: ast.Call) -> bool:
    """``deepspeed.initialize(...)`` with a config of ZeRO stage 0 (or none) read in the file:
    the engine all-reduces the gradients of its module's parameters only (ZeRO 1-3 reduce
    what their optimizer holds)."""
    if (dotted(call.func) or "") != "deepspeed.initialize":
        return False
    ref = ctx.ds_config()
    return ref is not None and ref.stage in (None, 0)


def outside_modules(ctx: FileContext) -> list[tuple[str, str, ast.Call]]:
    """(reference, class, optimizer call) of each module of the file's own classes holding
    an ``nn.Parameter``, instantiated on its own (never given to a wrapper or another call)
    and stepped by an optimizer, in a file that wraps a model for data parallelism."""
    def compute() -> list[tuple[str, str, ast.Call]]:
        wrappers = [c for c in ctx.of(ast.Call) if call_attr(c) in DDP_WRAPPERS
                    or (dotted(c.func) or "") == "deepspeed.initialize"]
        classes = _param_classes(ctx) if wrappers else set()
        out = []
        for node in ctx.of(ast.Assign) if wrappers else []:
            if not (isinstance(node.value, ast.Call) and len(node.targets) == 1):
                continue
            cls = (dotted(node.value.func) or "").rsplit(".", 1)[-1]
            bare = cls == "Parameter" and not _in_module_class(ctx, node)
            ref = dotted(node.targets[0])
            if not (cls in classes or bare) or ref is None or _given_away(ctx, ref) \
                    or any(_mentions(w, ref) for w in wrappers):
                continue
            opt = _stepped_by_optimizer(ctx, ref, bare)
            if opt is None or any(
                    (dotted(w.func) or "") == "deepspeed.initialize" and not _zero0_initialize(ctx, w)
                    and _handed_to_initialize(ctx, w, ref, opt) for w in wrappers):
                continue
            out.append((ref, "" if bare else cls, opt))
        return out
    return ctx._cached("outside_modules", ctx.tree, compute)  # type: ignore[no-any-return]


def reduces_an_outside_module(ctx: FileContext, reduce: ast.AST) -> bool:
    """A gradient reduction that covers a module outside the wrapper (the loop around it
    iterates over that module's parameters, or its argument names them): the wrapper never
    averaged those gradients, so reducing them by hand is the fix, not a second average."""
    refs = [ref for ref, _, _ in outside_modules(ctx)]
    if not refs:
        return False
    scopes: list[ast.AST] = [reduce]
    loop = ctx.enclosing(reduce, (ast.For,))
    if isinstance(loop, ast.For):
        scopes.append(loop.iter)
    return any((dotted(n) or "").startswith(ref + ".") for s in scopes for n in walk_all(s)
               for ref in refs)


@rule("AG180")
def module_outside_the_wrapper(ctx: FileContext) -> Iterator[Finding]:
    if _reduces_by_hand(ctx):
        return
    for ref, cls, opt in outside_modules(ctx):
        what = (f"a `{cls}`, which holds an nn.Parameter" if cls
                else "an nn.Parameter held outside any module")
        stepped = f"`{ref}`'s parameters" if cls else f"`{ref}`"
        yield ctx.finding(
            "AG180",
            opt,
            f"`{ref}` ({what}) is stepped by this optimizer "
            "but is not inside the module the data-parallel wrapper holds, and the script "
            "all-reduces no gradient itself: the wrapper averages its own module's gradients "
            f"only, so each rank steps {stepped} on its own gradient",
        )
        return


def _grad_tensors(ctx: FileContext) -> list[tuple[ast.AST, str, str]]:
    """Tensors that require a gradient but are not parameters: ``self.register_buffer("name",
    <a tensor made with requires_grad=True>)`` and, in an ``nn.Module`` subclass,
    ``self.name = torch.full(..., requires_grad=True)``: (node, name, "buffer"/"attribute")."""
    def wants_grad(value: ast.AST) -> bool:
        return any(isinstance(n, ast.keyword) and n.arg == "requires_grad"
                   and isinstance(n.value, ast.Constant) and n.value.value is True
                   for n in walk_all(value)) or any(
            isinstance(n, ast.Call) and call_attr(n) == "requires_grad_" for n in walk_all(value))
    out: list[tuple[ast.AST, str, str]] = []
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        if call_attr(call) == "register_buffer" and len(call.args) >= 2 \
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str) \
                and wants_grad(call.args[1]):
            out.append((call, call.args[0].value, "buffer"))
    assigns: list[ast.Assign] = ctx.of(ast.Assign)
    for a in assigns:
        if len(a.targets) == 1 and isinstance(t := a.targets[0], ast.Attribute) \
                and dotted(t.value) == "self" and isinstance(a.value, ast.Call) \
                and last_part(dotted(a.value.func)) != "parameter" \
                and "parameter" not in {last_part(dotted(n.func)) for n in walk_all(a.value)
                                        if isinstance(n, ast.Call)} \
                and wants_grad(a.value) and _in_module_class(ctx, a):
            out.append((a, t.attr, "attribute"))
    return out


def _tensor_stepped(ctx: FileContext, attr: str) -> ast.Call | None:
    """An optimizer (or ``add_param_group``) given ``<obj>.<attr>``: directly, through a name,
    or through a method whose return value holds ``self.<attr>`` (``temperature_params()``)."""
    def held(n: ast.AST) -> bool:
        return (dotted(n) or "").endswith("." + attr) and not isinstance(ctx.parents.get(n), ast.Attribute)
    returning = {f.name for f in ctx.of(ast.FunctionDef) if any(
        isinstance(r, ast.Return) and r.value is not None
        and any(dotted(n) == f"self.{attr}" for n in walk_all(r.value)) for r in walk_all(f))}
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        if not (last_part(dotted(call.func)) in OPTIMIZER_CLASSES
                or call_attr(call) == "add_param_group") or not call.args:
            continue
        sources: list[ast.AST] = [call.args[0]]
        for n in walk_all(call.args[0]):
            if isinstance(n, ast.Name):
                sources += ctx.assigned_in(ctx.scope_of(call)).get(n.id, [])
        if any(held(n) or (isinstance(n, ast.Call) and call_attr(n) in returning)
               for src in sources for n in walk_all(src)):
            return call
    return None


@rule("AG357")
def grad_tensor_outside_the_reduction(ctx: FileContext) -> Iterator[Finding]:
    """AG357 (F10): a tensor that requires a gradient but is not a parameter (a buffer
    registered with ``requires_grad=True``, FSDP2 refusing a 0-d parameter; a plain tensor
    attribute of a module, ``self.log_std = torch.full(..., requires_grad=True)``) in a
    data-parallel file, that an optimizer steps: the wrappers reduce the gradients of
    parameters only."""
    if not data_parallel(ctx) or _reduces_by_hand(ctx):
        return
    for node, attr, kind in _grad_tensors(ctx):
        opt = _tensor_stepped(ctx, attr)
        if opt is None:
            continue  # a tensor no optimizer steps (a checkpointing dummy): nothing drifts
        what = "registered as a buffer" if kind == "buffer" else "a plain tensor attribute of the module"
        yield ctx.finding(
            "AG357",
            node,
            f"`{attr}` is {what} that requires a gradient, not a parameter, and the optimizer "
            f"at line {opt.lineno} steps it: the data-parallel wrapper reduces the gradients of "
            "parameters only, so each rank's copy learns from its own micro-batches"
            + (" (under DDP the next forward's buffer broadcast then copies rank 0's value over "
               "the others)" if kind == "buffer" else ""),
        )
        return


def _names_from_parameters(ctx: FileContext, expr: ast.AST) -> ast.Call | None:
    """The ``named_parameters()``/``parameters()`` call a list of names is built from
    (directly, or through a name bound in the same scope), when no ``requires_grad`` test
    filters it (a list of frozen parameters is fine to ignore)."""
    sources: list[ast.AST] = [expr]
    if isinstance(expr, ast.Name):
        sources += ctx.assigned_in(ctx.scope_of(expr)).get(expr.id, [])
    for src in sources:
        if "requires_grad" in ast.unparse(src):
            continue
        found = next((n for n in walk_all(src) if isinstance(n, ast.Call)
                      and call_attr(n) in ("named_parameters", "parameters")), None)
        if found is not None:
            return found
    return None


@rule("AG359")
def trained_parameters_ignored_by_ddp(ctx: FileContext) -> Iterator[Finding]:
    """AG359 (F10): ``DDP._set_params_and_buffers_to_ignore_for_model(model, names)`` with
    names taken from ``named_parameters()`` (not only buffers) and not filtered to the frozen
    ones: DDP never all-reduces an ignored parameter's gradient, so each rank steps its own."""
    if _reduces_by_hand(ctx):
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) != "_set_params_and_buffers_to_ignore_for_model" or len(call.args) < 2:
            continue
        source = _names_from_parameters(ctx, call.args[1])
        if source is None:
            continue
        frozen = _frozen_somewhere(ctx)
        f = ctx.finding(
            "AG359",
            call,
            f"the names DDP is told to ignore come from `{ast.unparse(source)}` (line "
            f"{source.lineno}), with no requires_grad filter"
            + (" (the file freezes some parameters: if every ignored one is frozen, this is "
               "fine)" if frozen else ", so they include trainable parameters")
            + ": DDP never all-reduces an ignored parameter's gradient, and each rank steps a "
            "trainable one on its own micro-batches",
        )
        yield f if not frozen else replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        return


def _frozen_somewhere(ctx: FileContext) -> bool:
    """The file turns ``requires_grad`` off somewhere (``requires_grad_(False)``,
    ``.requires_grad = False``)."""
    return any((isinstance(n, ast.Call) and call_attr(n) == "requires_grad_" and n.args
                and isinstance(n.args[0], ast.Constant) and n.args[0].value is False)
               or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                   and n.value.value is False and any(
                       isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets))
               for n in walk_all(ctx.tree))


@rule("AG363")
def submodule_wrapped_in_place(ctx: FileContext) -> Iterator[Finding]:
    """AG363 (F10): the file's only DDP wrap is of a submodule, put back in place
    (``net.backbone = DDP(net.backbone)``), while an optimizer steps the parameters of a
    larger module: DDP averages the submodule's gradients only, the rest (task heads) train on
    each rank's own gradient."""
    wraps = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").rsplit(".", 1)[-1]
             in ("DDP", "DistributedDataParallel", "fully_shard", "FSDP", "FullyShardedDataParallel")]
    if len(wraps) != 1 or _reduces_by_hand(ctx):
        return
    wrap = wraps[0]
    owner = ctx.parents.get(wrap)
    if not (isinstance(owner, ast.Assign) and len(owner.targets) == 1 and wrap.args
            and isinstance(t := owner.targets[0], ast.Attribute)
            and dotted(t) == dotted(wrap.args[0])):
        return
    sub = dotted(t) or ""
    opts = [c for c in ctx.of(ast.Call) if last_part(dotted(c.func)) in OPTIMIZER_CLASSES and c.args]
    whole = [o for o in opts if any(
        isinstance(n, ast.Call) and call_attr(n) == "parameters" and isinstance(n.func, ast.Attribute)
        and (dotted(n.func.value) or "") not in (sub, sub.rsplit(".", 1)[-1])
        for n in walk_all(o.args[0]))]
    if not whole or len(whole) != len(opts):
        return
    f = ctx.finding(
        "AG363", wrap,
        f"`{sub} = {ast.unparse(wrap.func)}({sub})` wraps one submodule in place, the file's only "
        f"data-parallel wrap, while the optimizer at line {whole[0].lineno} steps the parameters "
        f"of `{ast.unparse(whole[0].args[0])}`: the wrapper averages the gradients of `{sub}` "
        "only, and every other parameter of the module around it (task heads) trains on each "
        "rank's own gradient")
    yield f if not _frozen_somewhere(ctx) else replace(
        f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


def _iterations(fn: ast.AST, name: str) -> list[ast.AST]:
    """The places in ``fn`` that iterate over the plain name ``name``: ``for ... in name``,
    a comprehension over it, or ``zip``/``list``/``tuple``/``enumerate``/``sum`` of it."""
    out: list[ast.AST] = []
    for n in walk_all(fn):
        looped = isinstance(n, ast.For | ast.comprehension) and isinstance(n.iter, ast.Name) \
            and n.iter.id == name
        consumed = isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
            and n.func.id in ("zip", "list", "tuple", "enumerate", "sum", "sorted") \
            and any(isinstance(a, ast.Name) and a.id == name for a in n.args)
        if looped or consumed:
            out.append(n)
    return out


def _writes_grad(node: ast.AST, fn: ast.AST) -> bool:
    """A ``.grad`` written (``p.grad.copy_(g)``, ``p.grad = g``, ``p.grad /= w``) in the loop
    ``node`` belongs to (or in ``node`` itself)."""
    loop = node
    for cand in walk_all(fn):
        if isinstance(cand, ast.For) and any(x is node for x in walk_all(cand.iter)):
            loop = cand
    for n in walk_all(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr in ("copy_", "div_", "mul_", "set_") \
                and (dotted(n.func.value) or "").endswith(".grad"):
            return True
        if isinstance(n, ast.Assign | ast.AugAssign):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any((dotted(t) or "").endswith(".grad") for t in targets):
                return True
    return False


@rule("AG183")
def generator_spent_before_write_back(ctx: FileContext) -> Iterator[Finding]:
    """AG183 (F10): the parameters of a hand-written gradient reduction held in a generator
    (``params = (p for p in model.parameters() if p.grad is not None)``) that one loop
    consumes (gathering the gradients to reduce) before another iterates it to write the
    reduced values back into ``.grad``: a generator runs once, the second loop runs zero
    times, and each rank's optimizer steps its own gradient."""
    for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
        if not any(isinstance(n, ast.Call) and call_attr(n) in _REDUCERS for n in walk_all(fn)):
            continue
        for name, values in ctx.assigned_in(fn).items():
            if len(values) != 1 or not isinstance(values[0], ast.GeneratorExp):
                continue
            uses = sorted(_iterations(fn, name), key=lambda n: (getattr(n, "lineno", 0),
                                                                 getattr(n, "col_offset", 0)))
            if len(uses) < 2 or not any(_writes_grad(u, fn) for u in uses[1:]):
                continue
            yield ctx.finding(
                "AG183",
                values[0],
                f"`{name}` is a generator, and it is iterated twice (line "
                f"{getattr(uses[0], 'lineno', '?')} and line {getattr(uses[1], 'lineno', '?')}):"
                " the first pass consumes it, so the loop writing the reduced gradients back "
                "into .grad runs zero times and each rank steps its own gradient",
                fix="make it a list: `params = [p for p in model.parameters() if p.grad is not "
                    "None]`",
            )
            return


def _trainable_list(value: ast.AST) -> bool:
    """``[p for p in m.parameters() if p.requires_grad]`` or ``list(filter(lambda p:
    p.requires_grad, m.parameters()))``: the parameters that require a gradient now."""
    if isinstance(value, ast.Call) and dotted(value.func) == "list" and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        gen = value.generators[0]
        return isinstance(gen.iter, ast.Call) and call_attr(gen.iter) in ("parameters", "values") and any(
            "requires_grad" in ast.unparse(t) for t in gen.ifs)
    if isinstance(value, ast.Call) and dotted(value.func) == "filter" and len(value.args) == 2:
        return "requires_grad" in ast.unparse(value.args[0]) \
            and isinstance(value.args[1], ast.Call) and call_attr(value.args[1]) == "parameters"
    return False


def _unfreezes_in_training(ctx: FileContext) -> ast.AST | None:
    """A ``requires_grad_()`` / ``requires_grad_(True)`` call or ``.requires_grad = True``
    inside a loop that also runs a backward or an optimizer step (an unfreeze mid-run)."""
    for n in walk_all(ctx.tree):
        on = (isinstance(n, ast.Call) and call_attr(n) == "requires_grad_"
              and (not n.args or (isinstance(n.args[0], ast.Constant) and n.args[0].value is True)))
        on = on or (isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets)
            and isinstance(n.value, ast.Constant) and n.value.value is True)
        if not on:
            continue
        loop = ctx.parents.get(n)
        while loop is not None:
            if isinstance(loop, ast.For | ast.While) and any(
                    isinstance(c, ast.Call) and call_attr(c) in ("backward", "step")
                    for c in walk_all(loop)):
                return n
            loop = ctx.parents.get(loop)
    return None


@rule("AG185")
def list_built_before_unfreeze(ctx: FileContext) -> Iterator[Finding]:
    built: dict[str, list[ast.AST]] = {}
    for targets, value in ctx.assignments():
        for t in targets:
            built.setdefault(t, []).append(value)
    lists = {name for name, values in built.items()
             if len(values) == 1 and _trainable_list(values[0])}
    if not lists:
        return
    unfreeze = None
    for loop in ctx.of(ast.For):
        name = dotted(loop.iter)
        if name not in lists or not isinstance(loop.target, ast.Name) \
                or not _reduces_grad_of(loop.body, loop.target.id):
            continue
        unfreeze = unfreeze or _unfreezes_in_training(ctx)
        if unfreeze is None:
            return
        yield ctx.finding(
            "AG185",
            loop,
            f"the gradients are all-reduced over `{name}`, the parameters that required a "
            f"gradient when it was built (`{ast.unparse(built[name][0])}`), but line "
            f"{getattr(unfreeze, 'lineno', '?')} turns requires_grad on during training: the "
            "parameters unfrozen then get gradients that are never averaged over the ranks, so "
            "each rank steps them on its own gradient",
        )
        return


def _new_from_grad(value: ast.AST, var: str) -> bool:
    """``value`` makes a new tensor from ``<var>.grad``: arithmetic on it (``p.grad / W``) or
    a ``.clone()`` (``.detach()``, ``.float()``, ``.to()`` may return the same storage)."""
    grads = {f"{var}.grad", f"{var}.grad.data"}
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div | ast.Mult | ast.Add | ast.Sub):
        return any(dotted(side) in grads for side in (value.left, value.right))
    if isinstance(value, ast.Call) and call_attr(value) == "clone" \
            and isinstance(value.func, ast.Attribute):
        inner = value.func.value
        if isinstance(inner, ast.Call) and call_attr(inner) == "detach" and isinstance(inner.func, ast.Attribute):
            inner = inner.func.value
        return dotted(inner) in grads
    return False


def _writes_back(body: list[ast.stmt], var: str, name: str) -> bool:
    """Something in ``body`` writes ``name`` (or anything) into ``<var>.grad``."""
    for stmt in body:
        for n in walk_all(stmt):
            if isinstance(n, ast.Assign | ast.AugAssign):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any((dotted(t) or "").startswith(f"{var}.grad") for t in targets):
                    return True
            if isinstance(n, ast.Call) and call_attr(n) in ("copy_", "set_", "add_") \
                    and isinstance(n.func, ast.Attribute) \
                    and (dotted(n.func.value) or "").startswith(f"{var}.grad"):
                return True
    return False


@rule("AG193")
def copy_reduced_not_written_back(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name) \
                or not (isinstance(loop.iter, ast.Call) and call_attr(loop.iter) == "parameters"
                        or "param" in (dotted(loop.iter) or "").lower()):
            continue
        var = loop.target.id
        made = {}
        for stmt in loop.body:
            for n in walk_all(stmt):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                        and isinstance(n.targets[0], ast.Name) and _new_from_grad(n.value, var):
                    made[n.targets[0].id] = n
        for stmt in loop.body:
            for n in walk_all(stmt):
                if not (isinstance(n, ast.Call) and call_attr(n) in _REDUCERS and n.args
                        and isinstance(n.args[0], ast.Name) and n.args[0].id in made):
                    continue
                name = n.args[0].id
                if _writes_back(loop.body, var, name):
                    continue
                yield ctx.finding(
                    "AG193",
                    n,
                    f"`{ast.unparse(n)}` reduces `{name}`, a new tensor "
                    f"(`{ast.unparse(made[name].value)}`, line {made[name].lineno}), and nothing "
                    f"writes it back into `{var}.grad`: the gradient the optimizer steps is never "
                    "averaged over the ranks, each rank steps on its own",
                    fix=f"reduce the gradient itself: `{var}.grad /= world_size; "
                        f"dist.all_reduce({var}.grad)` (or copy the result back with "
                        f"`{var}.grad.copy_({name})`)",
                )
                return


@rule("AG195")
def loop_variable_rebound(ctx: FileContext) -> Iterator[Finding]:
    """AG195 (F10): a write-back loop that rebinds its own loop variable to the reduced
    value, in a function that all-reduces: the assignment changes the name, not the tensor."""
    for loop in ctx.of(ast.For):
        if not isinstance(loop, ast.For):
            continue
        targets = [loop.target] if isinstance(loop.target, ast.Name) else list(
            loop.target.elts) if isinstance(loop.target, ast.Tuple) else []
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if not names:
            continue
        for stmt in loop.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id in names
                    and isinstance(stmt.value, ast.Name) and stmt.value.id in names):
                continue
            fn = ctx.enclosing(loop, (ast.FunctionDef, ast.AsyncFunctionDef)) or ctx.tree
            if not ctx._cached("reduces_in", fn, lambda fn=fn: any(  # (once per function)
                    isinstance(n, ast.Call) and call_attr(n) in _REDUCERS for n in walk_all(fn))):
                break
            name = stmt.targets[0].id
            # (the rebound name read later in the body would be a local alias, not a write)
            if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                   for st in loop.body if st is not stmt and st.lineno > stmt.lineno
                   for n in ast.walk(st)):
                continue
            yield ctx.finding(
                "AG195",
                stmt,
                f"`{ast.unparse(stmt)}` rebinds the loop variable `{name}` to the reduced "
                f"value: the tensor `{name}` named is left as it was, so the reduced gradients "
                "never reach .grad and each rank steps on its own",
                fix=f"write into the tensor: `{name}.copy_({stmt.value.id})`",
            )
            return


def fsdp_ignored(ctx: FileContext) -> list[tuple[ast.Call, list[str]]]:
    """``fully_shard(module, ignored_params={model.logit_scale, ...})`` calls with the
    ignored parameters' attribute names: FSDP2 neither shards nor reduces them."""
    out: list[tuple[ast.Call, list[str]]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) != "fully_shard":
            continue
        given = next((k.value for k in call.keywords if k.arg == "ignored_params"), None)
        if isinstance(given, ast.Name):
            values = ctx.assigned_in(ctx.scope_of(call)).get(given.id, [])
            given = values[0] if len(values) == 1 else given
        if isinstance(given, ast.Call) and dotted(given.func) in ("set", "list", "tuple") and given.args:
            given = given.args[0]
        if isinstance(given, ast.Set | ast.List | ast.Tuple):
            names = [n for e in given.elts if (n := last_part(dotted(e) or "")) and dotted(e)]
            if names:
                out.append((call, names))
    return out


def _grad_reductions(ctx: FileContext) -> list[set[str]]:
    """Per hand reduction of a gradient, the attribute names its tensor is made from (the
    argument, and the values its name was assigned in that scope)."""
    out: list[set[str]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) not in _REDUCERS or not call.args:
            continue
        exprs: list[ast.AST] = [call.args[0]]
        if isinstance(call.args[0], ast.Name):
            exprs += ctx.assigned_in(ctx.scope_of(call)).get(call.args[0].id, [])
        attrs = {n.attr for e in exprs for n in walk_all(e) if isinstance(n, ast.Attribute)}
        if "grad" in attrs or "grad" in ast.unparse(call.args[0]):
            out.append(attrs)
    return out


@rule("AG337")
def fsdp_ignored_params_never_reduced(ctx: FileContext) -> Iterator[Finding]:
    ignored = fsdp_ignored(ctx)
    if not ignored:
        return
    reductions = _grad_reductions(ctx)
    for call, names in ignored:
        missing = [n for n in names if not any(n in attrs or len(attrs) <= 1 for attrs in reductions)]
        if not missing:
            continue
        yield ctx.finding(
            "AG337",
            call,
            f"`{', '.join(missing)}` is in `fully_shard`'s ignored_params: FSDP2 neither shards "
            "nor reduces it, and no all-reduce of the file averages its gradient, so each rank "
            "steps its own copy on its own gradient and the copies drift apart",
        )
