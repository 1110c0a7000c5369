"""Precision rules (F12): where the gradient accumulates across a window, and in which dtype.

AG120: the model itself cast to bf16/fp16 (``.to(torch.bfloat16)``, ``.half()``) while a
window accumulates K > 1 backwards: the ``.grad`` buffers are low precision too. A
warning; an error when every K in sight for that window is at least ``_F12_ERROR_K`` (the
same threshold as AG126 and watch: :func:`accumguard.core.precision.f12_error_k`).
Also a Lightning ``Trainer(precision="bf16-true")`` (or ``"16-true"``) with
``accumulate_grad_batches`` > 1: Lightning casts the parameters, so the window sums in them.

AG126: FSDP2 ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=bf16))`` with
``reduce_dtype`` bf16 (or unset: it then reduces in ``param_dtype``) while a window defers
the gradient sync over K > 1 micro-batches (``set_requires_gradient_sync(False)``): FSDP2
keeps the unsharded gradient of the window in the reduce dtype, so every micro-batch is
added into a bf16 buffer and the rounding drift grows like u*sqrt(K). With ``reduce_dtype``
fp32 FSDP2 accumulates the unsharded gradient in fp32. The severity follows the watch
rule (core/precision): an error when every K in sight is at least ``_F12_ERROR_K`` (4), a
warning when a K is not known.

AG364: PEFT's ``get_peft_model(base, cfg, autocast_adapter_dtype=False)`` on a bf16/fp16 base
with K > 1: the adapters, the only trainable parameters, stay in the base's dtype and their
``.grad`` sums every window in it (PEFT upcasts them to fp32 unless told not to). The same
severity rule as AG120.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.core.precision import f12_error_k
from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import lightning_accumulates
from accumguard.static.lint.families._modguard import k_values, mod_term

#: K from which a bf16/fp16 accumulation is an error, as in watch's rule (core/precision:
#: the one place of that bound)
_F12_ERROR_K = f12_error_k()

_LOW_DTYPES = ("bfloat16", "float16", "half")
_FP32_GRAD_HINTS = re.compile(r"fp32_grad|grad_fp32|float32_grad|grad_accum_dtype|post_accumulate_grad")


def _low_precision_cast(node: ast.AST) -> bool:
    """``x.to(torch.bfloat16)``, ``x.to(dtype=torch.float16)``, ``x.half()``, ``x.bfloat16()``."""
    if not isinstance(node, ast.Call):
        return False
    attr = call_attr(node)
    if attr in ("half", "bfloat16") and not node.args and not node.keywords:
        return True
    if attr != "to":
        return False
    values = list(node.args) + [k.value for k in node.keywords if k.arg == "dtype"]
    return any((dotted(v) or "").split(".")[-1] in _LOW_DTYPES for v in values)


def _low_precision_models(ctx: FileContext) -> list[tuple[str, ast.Call]]:
    """(name, cast) for each module cast to bf16/fp16 whose ``.parameters()`` an optimizer
    constructor receives: ``model = Net().to(torch.bfloat16)``, ``model.half()``."""
    optimized: set[str] = set()
    for call in ctx.of(ast.Call):
        if call_attr(call) == "parameters" and (d := dotted(receiver(call))) is not None:
            parent = ctx.parents.get(call)
            if isinstance(parent, ast.Call) and call in parent.args:
                ctor = call_attr(parent) or ""
                if ctor[:1].isupper() or "optim" in (dotted(parent.func) or ""):
                    optimized.add(d)
        elif "optim" in (call_attr(call) or "").lower():
            # a wrapper handed the module itself: `MasterWeightOptimizer(model, torch.optim.SGD)`
            optimized.update(d for a in call.args if (d := dotted(a)) is not None)
    optimized |= _master_sources(ctx)
    out: list[tuple[str, ast.Call]] = []
    for call in ctx.of(ast.Call):
        if not _low_precision_cast(call):
            continue
        parent = ctx.parents.get(call)
        target: str | None = None
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            target = dotted(parent.targets[0])
        elif isinstance(parent, ast.Expr):
            target = dotted(receiver(call))  # nn.Module.to/half casts in place
        if target is not None and target in optimized:
            out.append((target, call))
    return out


def _master_sources(ctx: FileContext) -> set[str]:
    """Modules whose ``.parameters()`` build a list an optimizer constructor receives:
    ``master = [p.detach().float() for p in model.parameters()]; opt = AdamW(master)``.
    The model's own .grad is where its backwards accumulate, whatever the optimizer holds."""
    handed = {d for call in ctx.of(ast.Call)
              if (call_attr(call) or "")[:1].isupper() or "optim" in (dotted(call.func) or "")
              for a in call.args if (d := dotted(a)) is not None}
    out: set[str] = set()
    for targets, value in ctx.assignments():
        if len(targets) != 1 or targets[0] not in handed or not isinstance(
                value, ast.ListComp | ast.GeneratorExp | ast.Call):
            continue
        for n in ast.walk(value):
            if isinstance(n, ast.Call) and call_attr(n) == "parameters" and (d := dotted(receiver(n))):
                out.add(d)
    return out


@rule("AG120")
def low_precision_model_accumulation(ctx: FileContext) -> Iterator[Finding]:
    """A whole model in bf16/fp16 with K > 1 backwards per optimizer step: the .grad buffers
    that accumulate are bf16/fp16 too. Not with DeepSpeed (its own grad_accum_dtype, AG204),
    nor when the file shows fp32 gradient buffers (a post-accumulate hook, a ``.grad`` moved
    on every micro-step: fp32 master gradients); master weights that only copy the
    already-accumulated ``.grad`` at the step do not help and are still reported."""
    models = _low_precision_models(ctx)
    if not models:
        return
    if _fp32_grad_hint(ctx):
        return
    windows = [
        w for w in ctx.windows()
        if (f := ctx.window_facts(w)).accumulating and not f.summed_loss and not f.engine_backward
        and not f.accelerate and not f.unguarded_optimizer_steps
    ]
    # the windows by class and by function (or module), in order: one lookup per model
    by_class: dict[ast.AST | None, list[ast.AST]] = {}
    by_scope: dict[ast.AST | None, list[ast.AST]] = {}
    for w in windows:
        by_class.setdefault(ctx.enclosing(w, (ast.ClassDef,)), []).append(w)
        by_scope.setdefault(ctx.scope_of(w), []).append(w)
    for name, cast in models:
        # the window must train this model: same function (or, for `self.model`, same class)
        in_class = name.startswith("self.")
        here = ctx.enclosing(cast, (ast.ClassDef,)) if in_class else ctx.scope_of(cast)
        if here is None:
            continue
        window = next(
            (w for w in (by_class if in_class else by_scope).get(here, ())
             if not _grads_moved_per_micro_step(ctx, w)),
            None,
        )
        if window is None:
            continue
        dtype = "fp16" if call_attr(cast) == "half" or "float16" in ast.unparse(cast).replace("bfloat16", "") else "bf16"
        ks = _window_k(ctx, window)
        known = sorted(k for k in ks if k is not None)
        error = bool(known) and None not in ks and known[0] >= _F12_ERROR_K
        k_text = f"K = {known[0]}" if error and len(known) == 1 else "several"
        finding = ctx.finding(
            "AG120",
            cast,
            f"`{name}` is cast to {dtype} and accumulates gradients over {k_text} micro-batches (the "
            f"window at line {getattr(window, 'lineno', 1)}): its .grad buffers are {dtype}, so each "
            "micro-batch's gradient is rounded as it is added, an error that grows with K"
            + (f" (an error from K >= {_F12_ERROR_K}, the watch rule's bound)" if error else ""),
        )
        if error:
            finding = replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)
        yield finding


def _fp32_grad_hint(ctx: FileContext) -> bool:
    """The file keeps the gradient in fp32 apart from .grad: a call, an assigned name or a
    keyword says so (``p.register_post_accumulate_grad_hook(...)``, ``self.fp32_grads =
    ...``, ``grad_accum_dtype=...``). Read from the file index (calls and assignments), not
    a walk of every name: a 5 MB file has ~300k of them."""
    def compute() -> bool:
        for call in ctx.of(ast.Call):
            if _FP32_GRAD_HINTS.search((dotted(call.func) or "").lower()) or any(
                    k.arg and _FP32_GRAD_HINTS.search(k.arg.lower()) for k in call.keywords):
                return True
        return any(_FP32_GRAD_HINTS.search(t.lower()) for targets, _ in ctx.assignments() for t in targets)
    return ctx._cached("precision_fp32_hint", ctx.tree, compute)  # type: ignore[no-any-return]


def _grad_readers(ctx: FileContext) -> set[str]:
    """Names of the file's functions and methods that read or write some ``.grad``."""
    def compute() -> set[str]:
        return {fn.name for fn in ctx.of(*FUNCS)
                if any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ctx.local_nodes(fn))}
    return ctx._cached("precision_grad_readers", ctx.tree, compute)  # type: ignore[no-any-return]


def _grads_moved_per_micro_step(ctx: FileContext, window: ast.AST) -> bool:
    """Some ``.grad`` is touched on every micro-step, outside the boundary: in the window
    (``m.grad = m.grad + p.grad.float(); p.grad = None``) or in a function of the file it
    calls there. The gradient may then leave the low-precision buffer after each backward
    (fp32 master gradients), so where it accumulates is not decided. Master weights
    updated only at the step (``m.grad = p.grad.float()`` inside ``step()``) do not count:
    the K backwards have been summed in the low-precision .grad by then."""
    readers = _grad_readers(ctx)
    for n in ctx.local_nodes(window):
        touches = (isinstance(n, ast.Attribute) and n.attr == "grad") or (
            isinstance(n, ast.Call) and call_attr(n) in readers
            and call_attr(n) not in ("step", "zero_grad"))
        if touches and not ctx.guarded(n, window):
            return True
    return False


# ---------------------------------------------------------------- AG126: FSDP2 bf16 reduce_dtype



def _low_dtype(expr: ast.AST | None) -> bool:
    return expr is not None and (dotted(expr) or "").split(".")[-1] in _LOW_DTYPES


def _table_dtype(ctx: FileContext, expr: ast.AST | None) -> ast.AST | None:
    """``DTYPES[args.reduce_dtype]``: the value a module dict literal of dtypes gives the key
    an argparse option's string default names (``--reduce-dtype``, ``default="bf16"``), else
    ``expr`` itself."""
    if not (isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name)):
        return expr
    tables = ctx.values_by_name().get(expr.value.id, [])
    key: ast.AST | None = expr.slice
    if isinstance(key, ast.Attribute):
        dest = key.attr
        defaults = [next((k.value for k in c.keywords if k.arg == "default"), None)
                    for c in ctx.of(ast.Call) if call_attr(c) == "add_argument" and c.args
                    and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)
                    and c.args[0].value.lstrip("-").replace("-", "_") == dest]
        key = defaults[0] if len(defaults) == 1 else None
    if len(tables) != 1 or not isinstance(tables[0], ast.Dict) \
            or not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return expr
    return next((v for k, v in zip(tables[0].keys, tables[0].values, strict=True)
                 if isinstance(k, ast.Constant) and k.value == key.value), expr)


def _low_reduce_policies(ctx: FileContext) -> list[ast.Call]:
    """``MixedPrecisionPolicy(...)`` calls with a bf16/fp16 ``reduce_dtype``, or a bf16/fp16
    ``param_dtype`` and a ``reduce_dtype`` that is unset or None (read by keyword only)."""
    out: list[ast.Call] = []
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").split(".")[-1] != "MixedPrecisionPolicy":
            continue
        kws = {k.arg: k.value for k in call.keywords}
        if None in kws or call.args:
            continue
        reduce = _table_dtype(ctx, kws.get("reduce_dtype"))
        # a reduce_dtype named low keeps the deferred sum in it (fp32 compute too)
        unset = reduce is None or (isinstance(reduce, ast.Constant) and reduce.value is None)
        if _low_dtype(reduce) or (_low_dtype(_table_dtype(ctx, kws.get("param_dtype")))
                                  and unset):
            out.append(call)
    return out


def _param_dtype(policy: ast.Call) -> str:
    value = next((k.value for k in policy.keywords if k.arg == "param_dtype"), None)
    return ast.unparse(value) if value is not None else "unset (float32)"


def _policy_used(ctx: FileContext, policy: ast.Call) -> bool:
    """The policy reaches ``fully_shard(..., mp_policy=...)``, inline or by its name."""
    parent = ctx.parents.get(policy)
    name = None
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        name = dotted(parent.targets[0])
    inline, named = _mp_policy_args(ctx)
    return id(policy) in inline or (name is not None and name in named)


def _mp_policy_args(ctx: FileContext) -> tuple[set[int], set[str]]:
    """What the file's ``fully_shard(...)`` calls pass as ``mp_policy=``: the value nodes
    (by id) and their dotted names; one pass (cached), not one per policy."""
    def compute() -> tuple[set[int], set[str]]:
        inline: set[int] = set()
        named: set[str] = set()
        for call in ctx.of(ast.Call):
            if call_attr(call) != "fully_shard":
                continue
            for k in call.keywords:
                if k.arg == "mp_policy":
                    inline.add(id(k.value))
                    if (d := dotted(k.value)) is not None:
                        named.add(d)
        return inline, named
    return ctx._cached("mp_policy_args", ctx.tree, compute)  # type: ignore[no-any-return]


def _window_k(ctx: FileContext, window: ast.AST) -> set[int | None]:
    """Every K the file gives this window: ``range(K)`` of a micro-batch loop, or the modulus
    of the ``if`` that gates its optimizer step."""
    if isinstance(window, ast.For | ast.AsyncFor) and isinstance(window.iter, ast.Call) \
            and call_attr(window.iter) == "range" and len(window.iter.args) == 1:
        return k_values(ctx, window.iter.args[0], window)
    out: set[int | None] = set()
    for call, kind in ctx.window_facts(window).steps:
        if kind != "optimizer":
            continue
        cur = ctx.parents.get(call)
        while cur is not None and cur is not window:
            if isinstance(cur, ast.If) and (guard := mod_term(cur.test)) is not None:
                out |= k_values(ctx, guard.modulus, window)
                break
            cur = ctx.parents.get(cur)
    if not out:
        # a flag assigned from the modulo (`is_last = (i + 1) % K == 0` ... `if is_last:`)
        for name in sorted(ctx.window_k_names(window)):
            out |= k_values(ctx, ast.parse(name, mode="eval").body, window)
    return out or {None}


def _defers_sync(ctx: FileContext, window: ast.AST) -> bool:
    """The window (or its function) switches FSDP2's gradient sync off on some micro-steps."""
    scope = ctx.enclosing(window, FUNCS) or ctx.tree
    return bool(ctx._cached("defers_sync", scope, lambda: any(
        isinstance(n, ast.Call) and call_attr(n) in ("set_requires_gradient_sync", "no_sync")
        for n in ctx.local_nodes(scope))))


@rule("AG126")
def fsdp2_low_precision_reduce(ctx: FileContext) -> Iterator[Finding]:
    policies = [p for p in _low_reduce_policies(ctx) if _policy_used(ctx, p)]
    if not policies:
        return
    windows = [
        # (a window that defers the sync accumulates, whatever its names say)
        w for w in ctx.windows()
        if not (f := ctx.window_facts(w)).summed_loss and not f.engine_backward
        and not f.accelerate and not f.unguarded_optimizer_steps and _defers_sync(ctx, w)
    ]
    if not windows:
        return
    ks = set().union(*(_window_k(ctx, w) for w in windows))
    if ks and None not in ks and max(k for k in ks if k is not None) < 2:
        return
    known = sorted(k for k in ks if k is not None)
    error = bool(known) and None not in ks and min(known) >= _F12_ERROR_K
    k_text = (f"K = {known[0]}" if len(known) == 1 and None not in ks else "K (its value not in sight)")
    for policy in policies:
        reduce = next((k.value for k in policy.keywords if k.arg == "reduce_dtype"), None)
        how = "reduce_dtype unset (FSDP2 then reduces in param_dtype)" if reduce is None or (
            isinstance(reduce, ast.Constant)) else f"reduce_dtype={ast.unparse(reduce)}"
        finding = ctx.finding(
            "AG126",
            policy,
            f"`{ast.unparse(policy.func)}` with param_dtype={_param_dtype(policy)} "
            f"and {how}, while the window at line {getattr(windows[0], 'lineno', 1)} defers the "
            f"gradient sync over {k_text} micro-batches: FSDP2 sums the window's unsharded "
            "gradient in that low-precision dtype, a rounding drift that grows like sqrt(K)"
            + (f" (an error from K >= {_F12_ERROR_K}, the watch rule's bound)" if error else ""),
        )
        if error:
            finding = replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)
        yield finding


def _str_setting(ctx: FileContext, value: ast.AST) -> str | None:
    """A string literal, or the one string a module constant or a class field (a config
    dataclass's default) is given."""
    if isinstance(value, ast.Constant):
        return value.value if isinstance(value.value, str) else None
    name = value.id if isinstance(value, ast.Name) else \
        value.attr if isinstance(value, ast.Attribute) else None
    found = []
    for n in ctx.of(ast.AnnAssign, ast.Assign):
        targets = [n.target] if isinstance(n, ast.AnnAssign) else n.targets
        if name is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found.append(n.value)
    return _str_setting(ctx, found[0]) if len(found) == 1 and found[0] is not None else None


@rule("AG120")
def lightning_true_precision_accumulation(ctx: FileContext) -> Iterator[Finding]:
    """A Lightning ``Trainer(precision="bf16-true")`` (or ``"16-true"``: the model's
    parameters themselves cast) with ``accumulate_grad_batches`` K > 1: Lightning sums the K
    micro-batches into bf16/fp16 ``.grad``."""
    if not lightning_accumulates(ctx):
        return
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "Trainer":
            continue
        prec = next((k.value for k in call.keywords if k.arg == "precision"), None)
        setting = _str_setting(ctx, prec) if prec is not None else None
        if setting not in ("bf16-true", "16-true"):
            continue
        dtype = "bf16" if setting.startswith("bf16") else "fp16"
        ks: set[int | None] = set()
        for c in ctx.of(ast.Call):
            for kw in c.keywords:
                if kw.arg == "accumulate_grad_batches":
                    ks |= ctx.int_candidates(kw.value)
        error = bool(ks) and None not in ks and min(k for k in ks if k is not None) >= _F12_ERROR_K
        finding = ctx.finding(
            "AG120",
            call,
            f"`precision=\"{setting}\"` casts the model's parameters to {dtype}, and "
            "`accumulate_grad_batches` > 1 sums the window's micro-batches into their "
            f"{dtype} .grad: each micro-batch's gradient is rounded as it is added, an error "
            "that grows with K"
            + (f" (K = {min(k for k in ks if k is not None)}: an error from K >= {_F12_ERROR_K}, "
               "the watch rule's bound)" if error else ""),
            fix="use precision=\"bf16-mixed\" (fp32 parameters and gradients, bf16 compute) "
                "when accumulating",
        )
        yield replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH) if error \
            else finding
        return


# ------------------------------------------------------ AG364: PEFT adapters kept in bf16/fp16

_PEFT_BUILDERS = ("get_peft_model", "from_pretrained", "prepare_model_for_kbit_training")


def _low_precision_base(ctx: FileContext, expr: ast.AST) -> ast.AST | None:
    """The cast (or the ``torch_dtype=``/``dtype=`` keyword) that makes the model ``expr``
    stands for bf16/fp16: the expression itself, or the one value its name is bound to, or a
    function of the file returning it; None when not in sight."""
    def low_dtype(value: ast.AST) -> bool:
        if isinstance(value, ast.Name):  # `dtype=MODEL_DTYPE` with `MODEL_DTYPE = torch.bfloat16`
            bound = ctx.values_by_name().get(value.id, [])
            value = bound[0] if len(bound) == 1 else value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value in ("bfloat16", "float16", "bf16", "fp16", "half")
        return (dotted(value) or "").split(".")[-1] in _LOW_DTYPES

    def low(node: ast.AST) -> ast.AST | None:
        for n in walk_all(node):
            if _low_precision_cast(n):
                return n
            if isinstance(n, ast.keyword) and n.arg in ("torch_dtype", "dtype") \
                    and low_dtype(n.value):
                return n.value
        return None

    if (found := low(expr)) is not None:
        return found
    for _ in range(3):  # a name bound to a name bound to the model
        if isinstance(expr, ast.Name):
            bound = ctx.values_by_name().get(expr.id, [])
            if len(bound) != 1:
                return None
            expr = bound[0]
        elif isinstance(expr, ast.Call) and (fn := ctx.callee_of(expr)) is not None:
            returns = [n.value for n in ctx.local_nodes(fn) if isinstance(n, ast.Return) and n.value]
            if len(returns) != 1:
                return None
            expr = returns[0]
        else:
            return None
        if (found := low(expr)) is not None:
            return found
    # the base cast in place before it reaches PEFT (`base.to(torch.bfloat16)`)
    return None


def _accumulation_ks(ctx: FileContext) -> set[int | None]:
    """Every K the file gives: an accumulation keyword (``TrainingArguments``/TRL configs,
    ``Accelerator``, Lightning's ``Trainer``), a ``GradientAccumulationPlugin``, and the
    K of each hand-written accumulating window."""
    from accumguard.static.lint.families.accelerate import accelerator_ks

    out: set[int | None] = set(accelerator_ks(ctx))
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg in ("gradient_accumulation_steps", "accumulate_grad_batches"):
                out |= k_values(ctx, kw.value, call)
    for w in ctx.windows():
        facts = ctx.window_facts(w)
        if facts.accumulating and not facts.accelerate and not facts.engine_backward:
            out |= _window_k(ctx, w)  # (an accumulate() block's K is the Accelerator's)
    return out


@rule("AG364")
def peft_adapters_kept_low_precision(ctx: FileContext) -> Iterator[Finding]:
    """PEFT's ``autocast_adapter_dtype=False`` on a bf16/fp16 base: the trainable adapters
    stay in the base's dtype (PEFT upcasts them to fp32 by default), so their ``.grad``
    sums the K micro-batches of every window in bf16/fp16."""
    for call in ctx.of(ast.Call):
        if (call_attr(call) or "") not in _PEFT_BUILDERS:
            continue
        off = next((k for k in call.keywords if k.arg == "autocast_adapter_dtype"), None)
        if off is None or not (isinstance(off.value, ast.Constant) and off.value.value is False):
            continue
        base = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "model"), None)
        cast = _low_precision_base(ctx, base) if base is not None else None
        if cast is None:
            continue
        ks = _accumulation_ks(ctx)
        known = sorted(k for k in ks if k is not None)
        if not ks or (known and known[-1] <= 1 and None not in ks):
            continue  # no accumulation in sight
        error = bool(known) and None not in ks and known[0] >= _F12_ERROR_K
        dtype = "fp16" if "float16" in ast.unparse(cast).replace("bfloat16", "") \
            or "half" in ast.unparse(cast) else "bf16"
        k_text = f"K = {known[0]}" if len(set(known)) == 1 and None not in ks else "K > 1"
        finding = ctx.finding(
            "AG364",
            off,
            f"`autocast_adapter_dtype=False` keeps the LoRA adapters in the base model's {dtype} "
            f"(cast at line {getattr(cast, 'lineno', '?')}): the only trainable parameters, and "
            f"their .grad sums the {k_text} micro-batches of every window in {dtype}, rounded "
            "at each addition (PEFT upcasts adapters to fp32 by default)"
            + (f"; an error from K >= {_F12_ERROR_K}, the watch rule's bound" if error else ""))
        if not error:
            finding = replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        yield finding
        return


# ------------------------------------------- AG372: the HF Trainer training a bf16/fp16 model

_HF_TRAINERS = ("Trainer", "SFTTrainer", "DPOTrainer", "RewardTrainer", "GRPOTrainer")


@rule("AG372")
def hf_trainer_low_precision_model(ctx: FileContext) -> Iterator[Finding]:
    """The Hugging Face Trainer (or a TRL trainer) given a model built in bf16/fp16
    (``from_config(cfg, dtype=torch.bfloat16)``, ``from_pretrained(..., torch_dtype=...)``,
    ``.to(torch.bfloat16)``) and no PEFT adapters (AG364's): its parameters, and the
    ``.grad`` the Trainer accumulates ``gradient_accumulation_steps`` micro-batches into, are
    bf16/fp16 (``bf16=True`` is autocast; it does not keep fp32 weights or gradients)."""
    if any((call_attr(c) or "") in ("get_peft_model", "LoraConfig") or
           (dotted(c.func) or "").rsplit(".", 1)[-1] in ("get_peft_model", "LoraConfig")
           for c in ctx.of(ast.Call)):
        return
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] not in _HF_TRAINERS:
            continue
        model = next((k.value for k in call.keywords if k.arg == "model"),
                     call.args[0] if call.args else None)
        cast = _low_precision_base(ctx, model) if model is not None else None
        if cast is None:
            continue
        ks: set[int | None] = set()
        for c in ctx.of(ast.Call):
            for kw in c.keywords:
                if kw.arg == "gradient_accumulation_steps":
                    ks |= k_values(ctx, kw.value, c)
        known = sorted(k for k in ks if k is not None)
        if not ks or (known and known[-1] <= 1 and None not in ks):
            continue  # no accumulation in sight
        error = bool(known) and None not in ks and known[0] >= _F12_ERROR_K
        dtype = "fp16" if "float16" in ast.unparse(cast).replace("bfloat16", "") else "bf16"
        k_text = f"K = {known[0]}" if len(set(known)) == 1 and None not in ks else "K > 1"
        f = ctx.finding(
            "AG372", call,
            f"the Trainer trains a model built in {dtype} (line "
            f"{getattr(cast, 'lineno', '?')}): its parameters and the .grad it sums the "
            f"{k_text} micro-batches of every window into are {dtype}, rounded at each "
            "addition (bf16=True/fp16=True is autocast: it keeps no fp32 weights or gradients)"
            + (f"; an error from K >= {_F12_ERROR_K}, the watch rule's bound" if error else ""))
        yield f if error else replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        return
