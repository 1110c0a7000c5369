"""Loss-normalisation rules: what the loss is divided by before backward.

The intended gradient is the sum of per-token gradients over the whole window
and all ranks, divided by the global count N. Three ways to miss it that can be
seen in the source:

AG104 (F5) the loss is a per-micro-batch token mean and is divided by K: a mean of
      micro-batch means (wrong whenever micro-batches hold different token counts).
AG112 (F10) under DDP/FSDP the loss is divided by the world size before backward;
      DDP already averages over ranks, so the gradient is G / W.
AG113 (F6) under DDP/FSDP the loss is divided by this rank's own token count, never
      all-reduced: DDP then averages rank-local means.
AG118 (F5) a Hugging Face ``Trainer`` subclass overrides ``compute_loss`` with a
      per-micro-batch mean and never uses ``num_items_in_batch``: with GA > 1 a mean of
      means; and transformers 5 then also skips its own /K whenever the model's forward
      takes ``**kwargs`` and the batch has labels (``loss_is_scaled_for_ga`` unset), so the
      gradient is K times too large.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    ACCUM_RE,
    FUNCS,
    GLOBAL_COUNT_RE,
    WORLD_RE,
    call_attr,
    dotted,
    identifiers,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._masked import (
    counted_per_micro_batch,
    counts_tokens,
    forward_token_mean,
    helper_called,
    hf_loss,
    masked_mean,
    masked_mean_helpers,
    micro_batch_count,
    token_mean_hints,
    window_normalised,
    window_sum_names,
)
from accumguard.static.lint.families._modguard import k_values
from accumguard.static.lint.families._rankavg import (
    custom_rank_reduction,
    hand_average,
    local_count,
    plain_model_only,
    reaches_hand_average,
    reciprocal_products,
    returned_reduced,
    simulates_ranks,
)
from accumguard.static.lint.families._worldprod import named_product_with_world
from accumguard.static.lint.families.deepspeed import engine_ga_above_one
from accumguard.static.lint.families.terms import returned_by_call

_NORMALISED_BY_COUNT = ("token", "num_items", "n_items", "count", "n_valid", "num_valid", "denom", "normali")
_GLOBAL_ONLY = re.compile(r"global|all_?reduce|world")


def _division(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(dividend, divisor) of ``a / b`` or ``a /= b``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return node.left, node.right
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
        return node.target, node.value
    return None


def _is_loss(expr: ast.AST) -> bool:
    return any("loss" in i or i in ("cross_entropy", "nll") for i in identifiers(expr))


def _is_loss_division(ctx: FileContext, node: ast.AST, dividend: ast.AST) -> bool:
    """The dividend is a loss, or the result is stored under a loss name (``loss = crit(...) / W``)."""
    return _is_loss(dividend) or any("loss" in n.lower() for n in _assigned_names(ctx, node))


def _assigned_names(ctx: FileContext, node: ast.AST) -> set[str]:
    """The names a division's result lands in (``loss = x / W`` -> {loss})."""
    if isinstance(node, ast.AugAssign):
        d = dotted(node.target)
        return {d} if d else set()
    cur = ctx.parents.get(node)
    while isinstance(cur, ast.BinOp | ast.UnaryOp | ast.Call | ast.Attribute):
        cur = ctx.parents.get(cur)
    if isinstance(cur, ast.Assign):
        return {d for d in (dotted(t) for t in cur.targets) if d}
    if isinstance(cur, ast.AnnAssign | ast.AugAssign):
        d = dotted(cur.target)
        return {d} if d else set()
    return set()


def _flows_to_backward(ctx: FileContext, node: ast.AST, depth: int = 0, *, through_returns: bool = False) -> bool:
    """Is the division part of the loss that is back-propagated: in its own function, or (with
    ``through_returns``) returned by a function of the file (``def compute_loss(...): return
    loss / W``) whose call is back-propagated where it is called (two calls deep)?"""
    if _flows_here(ctx, node):
        return True
    fn = ctx.enclosing(node, FUNCS)
    if (not through_returns or depth >= 2 or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            or not _returned(ctx, fn, node)):
        return False
    return any(_flows_to_backward(ctx, site, depth + 1, through_returns=True) for site in ctx.call_sites(fn))


def _returned(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef, node: ast.AST) -> bool:
    """``node`` is (part of) what ``fn`` returns: inside its ``return`` expression, or
    assigned to a name a later ``return`` gives back."""
    cur = ctx.parents.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, ast.Return):
            return True
        cur = ctx.parents.get(cur)
    names = _assigned_names(ctx, node)
    line = getattr(node, "lineno", 0)
    return any(isinstance(n, ast.Return) and n.value is not None and n.lineno > line
               and dotted(n.value) in names for n in ctx.local_nodes(fn))


def _flows_here(ctx: FileContext, node: ast.AST) -> bool:
    scope = ctx.scope_of(node)
    backwards = ctx.backward_losses(scope)
    calls = ctx._cached("backward_ids", scope, lambda: {id(call) for call, _ in backwards})
    cur = ctx.parents.get(node)
    while cur is not None and cur is not scope:  # inside `(loss / W).backward()`
        if id(cur) in calls:
            return True
        cur = ctx.parents.get(cur)
    targets = _assigned_names(ctx, node)
    if not targets:
        return False
    line = getattr(node, "lineno", 0)
    by_name = ctx._cached("backward_by_name", scope, lambda: _index_by_name(backwards))
    return any(call.lineno >= line for t in targets for call in by_name.get(t, ()))


def _index_by_name(backwards: list[tuple[ast.Call, set[str]]]) -> dict[str, list[ast.Call]]:
    out: dict[str, list[ast.Call]] = {}
    for call, src in backwards:
        for name in src:
            out.setdefault(name, []).append(call)
    return out


def _count_names(ctx: FileContext) -> set[str]:
    """Names assigned from a count (``n_local = sum(int(b["mask"].sum()) for b in window)``)."""
    def compute() -> set[str]:
        out: set[str] = set()
        for node in ctx.of(ast.Assign, ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None or len(targets) != 1 or not (d := dotted(targets[0])):
                continue
            if not isinstance(node.value, ast.Call | ast.BinOp | ast.Subscript | ast.Attribute | ast.Name):
                continue
            if counts_tokens(node.value) and not ctx.mentions_world(node.value):
                out.add(d)
        return out
    return ctx._cached("count_names", ctx.tree, compute)  # type: ignore[no-any-return]


def _is_count(ctx: FileContext, divisor: ast.AST, *, micro_batch: bool = True) -> bool:
    """``n_tokens``, ``mask.sum()``, ``(labels != -100).sum()``, or a name assigned from such a
    count: a count of this micro-batch (``micro_batch``: names saying window/total/global are
    not) or of this rank (only names saying global are not; whether it was all-reduced is
    checked by the caller)."""
    ids = list(identifiers(divisor))
    scope_re = GLOBAL_COUNT_RE if micro_batch else _GLOBAL_ONLY
    if any(WORLD_RE.search(i) or ACCUM_RE.search(i) or scope_re.search(i) for i in ids):
        return False
    if counts_tokens(divisor):
        return True
    if micro_batch:
        return False  # a name computed elsewhere may be the window's count: no guess
    names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
    return bool(names & _count_names(ctx))


def _world_only_below(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """The world size divides the divisor (``loss / (n / W)``: a multiplication by W), or
    this division is itself the divisor of another one (``n / W`` in ``loss / (n / W)``)."""
    parent = ctx.parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.right is node:
        return True
    inner = _division(divisor)
    return inner is not None and ctx.mentions_world(inner[1]) and not ctx.mentions_world(inner[0])


def _under_wrapper_branch(ctx: FileContext, node: ast.AST) -> bool:
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if isinstance(cur, ast.If) and any(
            re.search(r"ddp|fsdp|wrap|distributed|parallel|shard", i) for i in identifiers(cur.test)
        ):
            return True
        cur = ctx.parents.get(cur)
    return False


def _divisions(ctx: FileContext) -> Iterator[tuple[ast.AST, ast.AST, ast.AST]]:
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = _division(node)
        if d is not None:
            yield node, d[0], d[1]


def _all_reduced(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """The divisor is (built from) a name all-reduced in the division's scope or the file: a
    count over the window's micro-steps and every rank, neither K nor this micro-batch's own
    count (a name derived from the micro-batch list is not K once it was all-reduced)."""
    names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
    return bool(names & (ctx.all_reduced_names(ctx.scope_of(node)) | ctx.all_reduced_names(ctx.tree)))


def _divides_by_k(ctx: FileContext, window: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """Divisions of a loss by the accumulation steps in ``window``: (node, dividend)."""
    out = []
    for sub in ctx.local_nodes(window):
        d = _division(sub)
        if d is None or _all_reduced(ctx, sub, d[1]) or masked_mean(ctx, window, sub, set(), helpers=False):
            continue  # (x * mb.mask).sum() / mb.mask.sum() is a token mean, not a division by K
        ids = list(identifiers(d[1]))
        if not (ctx.mentions_accum(d[1]) or _len_of_window(window, d[1])) \
                or any(n in i for i in ids for n in _NORMALISED_BY_COUNT):
            continue
        if _is_loss_division(ctx, sub, d[0]):
            out.append((sub, d[0]))
    return out


def _len_of_window(window: ast.AST, divisor: ast.AST) -> bool:
    """``len(window)`` for a window loop ``for mb in window:``: the number of its micro-batches,
    K, whatever the name."""
    return (isinstance(window, ast.For | ast.AsyncFor) and isinstance(divisor, ast.Call)
            and dotted(divisor.func) == "len" and len(divisor.args) == 1
            and ast.dump(divisor.args[0]) == ast.dump(window.iter))


def _per_micro_batch_token_mean(ctx: FileContext, window: ast.AST) -> bool:
    """The window computes a loss as a division by a count of this micro-batch."""
    scope = ctx.window_scope(window)
    for sub in ctx.local_nodes(window):
        d = _division(sub)
        if d is None or _all_reduced(ctx, sub, d[1]):
            continue
        summed = _is_loss(d[0]) or any(isinstance(n, ast.Call) and call_attr(n) == "sum" for n in walk_all(d[0]))
        if summed and _is_count(ctx, d[1]):
            return True
        # a count this micro-step computes (from names the window assigns) divides whatever
        # lands in the loss: `loss = tok / n_tok` after `n_tok = (labels != -100).sum()`
        if (summed or _is_loss_division(ctx, sub, d[0])) and micro_batch_count(ctx, scope, window, d[1]):
            return True
    helpers = masked_mean_helpers(ctx, rows=False)  # (x * m).sum() / m.sum(), inline or in a helper
    return any(
        isinstance(n, ast.Call) and helper_called(n) in helpers
        or isinstance(n, ast.BinOp) and masked_mean(ctx, window, n, set(), helpers=False, rows=False)
        for n in ctx.local_nodes(window)
    )


def _accelerate_ga_above_one(ctx: FileContext) -> bool:
    """``Accelerator(gradient_accumulation_steps=K)`` in sight with every value K > 1 (once
    per file: it is asked for every Accelerate window)."""
    def compute() -> bool:
        values: set[int | None] = set()
        for call in ctx.of(ast.Call):
            if (dotted(call.func) or "").split(".")[-1] == "Accelerator":
                for kw in call.keywords:
                    if kw.arg == "gradient_accumulation_steps":
                        values |= k_values(ctx, kw.value, call)  # a parameter's default and callers too
        return bool(values) and all(v is not None and v > 1 for v in values)
    return bool(ctx._cached("accelerate_ga_above_one", ctx.tree, compute))


def _divided_by_window_count(ctx: FileContext, window: ast.AST) -> bool:
    """The window divides its loss by a token count made before its micro-batches (the
    Accelerate docs' gathered count): ``accelerator.backward``'s /K undoes the script's * K."""
    scope = ctx.window_scope(window)
    for sub in ctx.local_nodes(window):
        d = _division(sub)
        if d is not None and counts_tokens(d[1]) and not counted_per_micro_batch(
                ctx, scope, window, d[1]):
            return True
    return False


@rule("AG104")
def mean_of_means(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.summed_loss:
            continue
        by_k = [(n, d) for n, d in _divides_by_k(ctx, window)  # num_items_in_batch=window count: not F5
                if not window_normalised(ctx, ctx.scope_of(window), window, d)]
        by_accelerate = (not by_k and facts.accelerate and _accelerate_ga_above_one(ctx)
                         and not _divided_by_window_count(ctx, window))
        if by_accelerate:
            # accelerator.backward() divides the loss by gradient_accumulation_steps itself
            by_k = [
                (n, n) for n in ctx.local_nodes(window)
                if isinstance(n, ast.Call) and call_attr(n) == "backward" and ctx.is_accelerator(receiver(n))
            ]
        by_engine = (not by_k and facts.engine_backward and engine_ga_above_one(ctx)
                     and not _divided_by_window_count(ctx, window))
        if by_engine:
            # DeepSpeed's engine.backward divides the loss by the config's GA itself (unless
            # told scale_wrt_gas=False)
            by_k = [(n, n) for n in ctx.local_nodes(window) if isinstance(n, ast.Call)
                    and call_attr(n) == "backward" and n.args
                    and ctx.kind_of_receiver(receiver(n)) == "engine"
                    and not any(k.arg == "scale_wrt_gas" and isinstance(k.value, ast.Constant)
                                and k.value.value is False for k in n.keywords)]
        if not by_k:
            continue
        scope = ctx.window_scope(window)
        explicit = _per_micro_batch_token_mean(ctx, window)
        hints, summed = token_mean_hints(ctx, scope)
        if by_engine and not summed:
            # the loss computed in a helper the window calls (`token_ce(...)`): a mean, or a
            # sum (the window's count read in the window itself is then its normaliser)
            called = [f for n in ctx.local_nodes(window) if isinstance(n, ast.Call)
                      for f in ctx.defs_by_name().get(helper_called(n) or "", [])]
            found = [token_mean_hints(ctx, f) for f in called]
            hints = hints or any(h for h, _ in found)
            summed = any(sm for _, sm in found)
        cls = ctx.enclosing(window, (ast.ClassDef,)) if by_accelerate else None
        if by_accelerate and not hints and isinstance(cls, ast.ClassDef):
            # a trainer class builds its criterion in __init__ (CrossEntropyLoss(ignore_index=pad))
            methods = [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
            found = [token_mean_hints(ctx, f) for f in methods]
            hints = any(h for h, _ in found)
            summed = summed or any(sm for _, sm in found)
        if not explicit and not hints and not summed and all(
                hf_loss(ctx, scope, d) or forward_token_mean(ctx, scope, d) for _, d in by_k):
            # a HF model's .loss or a module's forward's token mean: -100/ignore_index in the
            # file (a reduction='sum' elsewhere, a reference, is not this loss)
            hints = bool(ctx._cached("token_hints_file", ctx.tree, lambda: any(
                token_mean_hints(ctx, f)[0] for f in ctx.of(ast.FunctionDef))))
        if not explicit and (not hints or summed):
            continue
        for node, _ in by_k:
            yield ctx.finding(
                "AG104",
                node,
                ("`accelerator.backward()` divides the loss by gradient_accumulation_steps"
                 if by_accelerate else
                 "DeepSpeed's `engine.backward()` divides the loss by the config's "
                 "gradient_accumulation_steps" if by_engine else
                 "the loss is divided by the number of accumulation steps")
                + ", but it is a mean over "
                + ("this micro-batch's own token count" if explicit else
                   "a variable number of tokens (padding mask / ignore_index in sight)")
                + ": dividing per-micro-batch means by K weights short micro-batches too much "
                "(mean of means)",
            )


@rule("AG112")
def loss_divided_by_world_under_ddp(ctx: FileContext) -> Iterator[Finding]:
    # a DeepSpeed engine's backward averages over the data-parallel ranks too
    engine = ctx.deepspeed and any(ctx.window_facts(w).engine_backward for w in ctx.windows())
    # a model accelerator.prepare() wrapped: DDP's average whenever num_processes > 1 (and a
    # division by num_processes changes nothing when it is 1)
    accelerate = ctx.accelerate and ctx.accelerate_prepare
    if not (ctx.ddp_wrapped or engine or accelerate) or not ctx.is_training_script() \
            or custom_rank_reduction(ctx):
        return
    for node, dividend, divisor in _divisions(ctx):
        if not (ctx.mentions_world(divisor) or named_product_with_world(ctx, divisor)) \
                or not _is_loss_division(ctx, node, dividend):
            continue
        if _world_only_below(ctx, node, divisor):
            continue  # loss / (count / W) multiplies by W: the all-reduced count's rank share
        if any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mult) and any(
            WORLD_RE.search(i) for i in identifiers(s)) for s in walk_all(dividend)):
            continue
        if _under_wrapper_branch(ctx, node) or simulates_ranks(ctx, node) \
                or not _flows_to_backward(ctx, node, through_returns=True):
            continue
        yield ctx.finding(
            "AG112",
            node,
            "the loss is divided by the world size before backward while the model is wrapped in "
            + ("DDP/FSDP" if ctx.ddp_wrapped else "a DeepSpeed engine" if engine else
               "DDP by accelerator.prepare() on several processes")
            + ", which already averages gradients over ranks: the optimizer receives G / W",
        )


@rule("AG113")
def rank_local_token_mean_under_ddp(ctx: FileContext) -> Iterator[Finding]:
    # a model accelerator.prepare() wraps is DDP whenever the run has several processes
    wrapped = ctx.ddp_wrapped or (ctx.accelerate and ctx.accelerate_prepare)
    by_hand = [] if wrapped else hand_average(ctx)
    if not (wrapped or by_hand) or not ctx.is_training_script() or custom_rank_reduction(ctx):
        return
    for node, dividend, divisor in [*_divisions(ctx), *reciprocal_products(ctx)]:
        if by_hand and not reaches_hand_average(ctx, node, by_hand):
            continue  # (a reference loop whose gradient no hand-written average touches)
        site = _rank_local_argument(ctx, node, divisor)
        counted = site is not None or _is_count(ctx, divisor, micro_batch=False) or (
            isinstance(divisor, ast.Name) and divisor.id in window_sum_names(ctx, node))
        if not counted or not (site is not None or _is_loss_division(ctx, node, dividend) or any(
            isinstance(n, ast.Call) and call_attr(n) == "sum" for n in walk_all(dividend)
        )):
            continue
        scope = ctx.scope_of(node)
        count_names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
        if count_names & ctx.all_reduced_names(scope) or count_names & ctx.all_reduced_names(ctx.tree):
            continue
        if site is not None:
            # a helper's parameter: the count its training call site passes
            if not plain_model_only(ctx, site) and not simulates_ranks(ctx, site) \
                    and _flows_to_backward(ctx, node, through_returns=True):
                yield ctx.finding(
                    "AG113", node,
                    f"under DDP/FSDP the loss is divided by `{ast.unparse(divisor)}`, which the "
                    f"call at line {site.lineno} gives as this rank's own count (of tokens or "
                    "samples), never all-reduced: DDP then averages rank-local means, so ranks "
                    "with fewer tokens weigh more")
            continue
        if not ctx.ddp_wrapped and not by_hand and not local_count(ctx, node, count_names):
            continue  # under Accelerate: only a count computed here, not named as the window's
        if returned_reduced(ctx, divisor):
            continue  # a helper of the file all-reduces the count it returns
        if _under_wrapper_branch(ctx, node) or not _flows_to_backward(ctx, node):
            continue
        if (not by_hand and plain_model_only(ctx, dividend)) or simulates_ranks(ctx, node):
            continue  # a single-process reference (never wrapped, or standing for every rank)
        window = ctx.enclosing(node, (ast.For, ast.AsyncFor, ast.While))
        if window is not None and ctx.is_window(window):
            facts = ctx.window_facts(window)
            if facts.accumulating and _divides_by_k(ctx, window):
                continue  # AG104 (F5) reports this loss
        engine = (f"the hand-written gradient average (line {by_hand[0].lineno}: "  # type: ignore[attr-defined]
                  f"`{ast.unparse(by_hand[0])}`)" if by_hand else "DDP")
        yield ctx.finding(
            "AG113",
            node,
            f"under {'DDP/FSDP' if not by_hand else 'a hand-written average over ranks'} the "
            f"loss is divided by `{ast.unparse(divisor)}`, this rank's own count (of tokens or "
            f"samples), which is never all-reduced: {engine} then averages rank-local means, "
            "so ranks with fewer tokens weigh more",
        )


def _rank_local_argument(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> ast.Call | None:
    """``divisor`` is a parameter of the function around ``node`` (``def compute_loss(model,
    batch, n): ... / n``), and a call of that function passes it a count this rank made of
    its own micro-batches (``n = sum((b["labels"] != -100).sum() for b in mine)``), all-reduced
    nowhere: that call, else None. A name assigned in the function is not a parameter."""
    fn = ctx.enclosing(node, FUNCS)
    if not isinstance(divisor, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if divisor.id not in params or divisor.id in _assigned_in(fn):
        return None
    at = params.index(divisor.id) - (1 if params and params[0] in ("self", "cls") else 0)
    for call in ctx.call_sites(fn):
        arg = next((k.value for k in call.keywords if k.arg == divisor.id), None)
        if arg is None and 0 <= at < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[:at + 1]):
            arg = call.args[at]
        if not isinstance(arg, ast.Name):
            continue
        names = {arg.id}
        counted = arg.id in window_sum_names(ctx, call) or (
            _is_count(ctx, arg, micro_batch=False) and local_count(ctx, call, names))
        reduced = names & (ctx.all_reduced_names(ctx.scope_of(call)) | ctx.all_reduced_names(ctx.tree))
        if counted and not reduced and not returned_reduced(ctx, arg):
            return call
    return None


def _assigned_in(fn: ast.AST) -> set[str]:
    return {t.id for a in ast.walk(fn) if isinstance(a, ast.Assign | ast.AugAssign | ast.AnnAssign)
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target]) if isinstance(t, ast.Name)}


# ---------------------------------------------------------------- AG118: HF Trainer.compute_loss

#: functional losses whose default reduction is a mean over this micro-batch's elements
_MEAN_LOSS_FUNCS = frozenset(
    {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
     "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"}
)
_LOSS_CLASS = re.compile(r"Loss$")


def _is_loss_class(func: ast.AST) -> bool:
    """``nn.CrossEntropyLoss``, ``torch.nn.MSELoss``, ``CrossEntropyLoss``: a loss module class."""
    return bool(_LOSS_CLASS.search((dotted(func) or "").rsplit(".", 1)[-1]))


def _reduction(call: ast.Call) -> str | None:
    """The ``reduction=`` a loss call or constructor was given ("mean" when absent), or None
    when it is computed."""
    kw = next((k.value for k in call.keywords if k.arg == "reduction"), None)
    if kw is None:
        return "mean"
    return kw.value if isinstance(kw, ast.Constant) and isinstance(kw.value, str) else None


def _mean_criteria(ctx: FileContext) -> set[str]:
    """Names assigned a mean-reducing loss module: ``self.loss_fct = nn.CrossEntropyLoss()``."""
    def compute() -> set[str]:
        out: set[str] = set()
        for names, value in ctx.assignments():
            if (
                isinstance(value, ast.Call)
                and _is_loss_class(value.func)
                and _reduction(value) == "mean"
                and len(names) == 1
            ):
                out.add(names[0])
        return out
    return ctx._cached("mean_criteria", ctx.tree, compute)  # type: ignore[no-any-return]


def _class_criteria(cls: ast.ClassDef) -> set[str]:
    """``self.X`` names that the class itself makes a mean-reducing loss module: a class
    attribute ``X = nn.CrossEntropyLoss()`` or ``self.X = nn.CrossEntropyLoss()`` in one of
    its methods, and no other assignment of ``self.X`` in the class (a sum-reducing module
    or a factory's result keeps it out)."""
    mean: set[str] = set()
    other: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = f"self.{stmt.targets[0].id}"
            is_mean = (isinstance(stmt.value, ast.Call) and _is_loss_class(stmt.value.func)
                       and _reduction(stmt.value) == "mean")
            (mean if is_mean else other).add(name)
    for n in walk_all(cls):
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            name = dotted(n.targets[0]) or ""
            if not name.startswith("self.") or name.count(".") != 1:
                continue
            is_mean = (isinstance(n.value, ast.Call) and _is_loss_class(n.value.func)
                       and _reduction(n.value) == "mean")
            (mean if is_mean else other).add(name)
    return mean - other


def _mean_loss_site(ctx: FileContext, fn: ast.AST, cls: ast.ClassDef | None = None
                    ) -> tuple[ast.AST, str] | None:
    """Where ``fn`` computes a per-micro-batch mean loss, and how it reads: a mean-reducing
    loss call, a mean-reducing loss module, the model's own ``outputs.loss`` (computed
    without ``num_items_in_batch``: a mean over this micro-batch's tokens), a ``.mean()``.
    With ``cls``, a ``self.X`` module is judged by the class's own assignments only
    (another class's ``self.loss_fct`` is another object)."""
    criteria = _mean_criteria(ctx)
    if cls is not None:
        criteria = {c for c in criteria if not c.startswith("self.")} | _class_criteria(cls)
    for n in ctx.local_nodes(fn):
        if isinstance(n, ast.Call):
            name = call_attr(n) or ""
            if name in _MEAN_LOSS_FUNCS and _reduction(n) == "mean":
                return n, f"`{ast.unparse(n.func)}(...)` with reduction='mean'"
            if isinstance(n.func, ast.Call) and _is_loss_class(n.func.func) and _reduction(n.func) == "mean":
                return n, f"`{ast.unparse(n.func.func)}()` with reduction='mean'"
            if (d := dotted(n.func)) is not None and d in criteria:
                return n, f"`{d}`, a mean-reducing loss module"
            if name == "mean" and not n.args and _is_loss(n.func):
                return n, f"`{ast.unparse(n)}`"
        elif (div := _division(n)) is not None and _is_count(ctx, _unpacked(ctx, fn, div[1])) and (
            _is_loss(top := _unpacked(ctx, fn, div[0])) or any(
                isinstance(x, ast.Call) and call_attr(x) == "sum" for x in walk_all(top))):
            return n, f"`{ast.unparse(n)}`, divided by this micro-batch's own count"
        elif (
            isinstance(n, ast.Attribute) and n.attr == "loss" and isinstance(n.ctx, ast.Load)
            and dotted(n.value) != "self"
        ) or (
            isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
            and isinstance(n.slice, ast.Constant) and n.slice.value == "loss"
        ):
            return n, f"`{ast.unparse(n)}`, the model's mean over this micro-batch's tokens"
    return None


def _unpacked(ctx: FileContext, fn: ast.AST, expr: ast.AST) -> ast.AST:
    """What a name of ``fn`` holds when ``fn`` binds it once from a call of a function of the
    file (``ce_sum, n_tok = token_ce_sum(model, batch)`` with ``return
    F.cross_entropy(..., reduction="sum"), (tgt != -100).sum()``): what that function returns
    for it (:func:`.terms.returned_by_call`); a clamp of it (``n_tok.clamp(min=1)``) reads
    through. Else ``expr`` itself."""
    inner = expr
    if isinstance(inner, ast.Call) and call_attr(inner) in ("clamp", "clamp_min", "clip") \
            and isinstance(inner.func, ast.Attribute):
        inner = inner.func.value
    if not isinstance(inner, ast.Name):
        return expr
    binds = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and any(isinstance(x, ast.Name) and x.id == inner.id for x in walk_all(n.targets[0]))]
    got = returned_by_call(ctx, binds[0], inner.id) if len(binds) == 1 else None
    return got[0] if got is not None else expr
