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

The shared facts about a loss expression (what divides it, whether it is back-propagated, a
per-micro-batch mean) live in ``_lossexpr``; AG118, the Trainer ``compute_loss`` shape, in
``hfscale`` and ``hfterms``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    FUNCS,
    WORLD_RE,
    call_attr,
    dotted,
    identifiers,
    mult_factors,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._acchorizon import accelerate_ga_above_one
from accumguard.static.lint.families._lossexpr import (
    all_reduced,
    divides_by_k,
    division,
    flows_to_backward,
    is_count,
    is_loss,
    is_loss_division,
    value_through,
)
from accumguard.static.lint.families._masked import (
    counted_per_micro_batch,
    counts_tokens,
    counts_window,
    forward_token_mean,
    helper_called,
    hf_loss,
    masked_mean,
    masked_mean_helpers,
    masks_labels,
    micro_batch_count,
    sized_slice,
    through_names,
    token_mean_hints,
    window_normalised,
    window_sum_names,
)
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


def _world_only_below(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """The world size divides the divisor (``loss / (n / W)``: a multiplication by W), or
    this division is itself the divisor of another one (``n / W`` in ``loss / (n / W)``)."""
    parent = ctx.parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.right is node:
        return True
    inner = division(value_through(ctx, node, divisor))
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
        d = division(node)
        if d is not None:
            yield node, d[0], d[1]


def _per_micro_batch_token_mean(ctx: FileContext, window: ast.AST) -> str | None:
    """The window computes a loss as a division by a count of this micro-step: where that
    count is taken ("on this rank", or "summed over the ranks" when it is all-reduced on
    every micro-step), else None."""
    scope = ctx.window_scope(window)
    for sub in ctx.local_nodes(window):
        d = division(sub)
        if d is None:
            continue
        where = "on this rank"
        if all_reduced(ctx, sub, d[1]):
            if not _reduced_per_micro_step(ctx, window, d[1]):
                continue  # (a count all-reduced once per window counts the window)
            where = "summed over the ranks"
        summed = is_loss(d[0]) or any(isinstance(n, ast.Call) and call_attr(n) == "sum" for n in walk_all(d[0]))
        if summed and is_count(ctx, d[1]):
            return where
        # a count this micro-step computes (from names the window assigns) divides whatever
        # lands in the loss: `loss = tok / n_tok` after `n_tok = (labels != -100).sum()`
        if (summed or is_loss_division(ctx, sub, d[0])) and micro_batch_count(ctx, scope, window, d[1]):
            return where
    helpers = masked_mean_helpers(ctx, rows=False)  # (x * m).sum() / m.sum(), inline or in a helper
    return "on this rank" if any(
        isinstance(n, ast.Call) and helper_called(n) in helpers
        or isinstance(n, ast.BinOp) and masked_mean(ctx, window, n, set(), helpers=False, rows=False)
        for n in ctx.local_nodes(window)
    ) else None


def _reduced_per_micro_step(ctx: FileContext, window: ast.AST, divisor: ast.AST) -> bool:
    """``divisor`` is a name all-reduced inside the window itself, on every micro-step, from
    a value of this micro-step (``n = n_tok.float(); dist.all_reduce(n)``): the micro-batch's
    count over the ranks, not the window's."""
    factors = mult_factors(divisor)  # (a product: `n_global * K`)
    inside = ctx.all_reduced_names(window) if isinstance(window, ast.For | ast.While) else set()
    return any(isinstance(f, ast.Name) and f.id in inside
               and counted_per_micro_batch(ctx, ctx.window_scope(window), window, f)
               for f in factors)


def _k_times_micro_count(ctx: FileContext, window: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """Divisions of a loss by K times a count all-reduced on every micro-step (``loss_sum *
    W / (n_global * K)`` with ``n_global`` this micro-step's tokens over the ranks): the
    division by K :func:`divides_by_k` leaves to a count all-reduced (node, dividend)."""
    out = []
    for sub in ctx.local_nodes(window):
        d = division(sub)
        if d is not None and any(ctx.mentions_accum(f) for f in mult_factors(d[1])) \
                and _reduced_per_micro_step(ctx, window, d[1]) \
                and is_loss_division(ctx, sub, d[0]):
            out.append((sub, d[0]))
    return out


def _divided_by_window_count(ctx: FileContext, window: ast.AST) -> bool:
    """The window divides its loss by a token count made before its micro-batches (the
    Accelerate docs' gathered count): ``accelerator.backward``'s /K undoes the script's * K."""
    scope = ctx.window_scope(window)
    for sub in ctx.local_nodes(window):
        d = division(sub)
        if d is not None and (counts_tokens(d[1]) or counts_window(ctx, d[1])) \
                and not counted_per_micro_batch(ctx, scope, window, d[1]):
            return True
    return False


@rule("AG104")
def mean_of_means(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.summed_loss:
            continue
        part, by_k = window, _k_divisions(ctx, window)
        for helper in () if by_k else ctx.inlined(window):
            if by_k := _k_divisions(ctx, helper):
                part = helper  # `loss / K` in the backward helper the window calls
                break
        micro = [] if by_k else _k_times_micro_count(ctx, window)
        by_k = by_k or micro
        by_accelerate = (not by_k and facts.accelerate and accelerate_ga_above_one(ctx)
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
        scope = ctx.window_scope(part)
        explicit = _per_micro_batch_token_mean(ctx, part) or (
            "summed over the ranks" if micro else None)
        hints, summed = token_mean_hints(ctx, scope)
        if (by_engine or not hints) and not summed:
            # the loss computed in a helper the window calls (`token_ce(...)`): a mean, or a
            # sum (the window's count read in the window itself is then its normaliser)
            called = [f for n in ctx.local_nodes(window) if isinstance(n, ast.Call)
                      for f in ctx.defs_by_name().get(helper_called(n) or "", [])]
            found = [token_mean_hints(ctx, f) for f in called]
            hints = hints or any(h for h, _ in found)
            summed = any(sm for _, sm in found)
        cls = ctx.enclosing(part, (ast.ClassDef,))
        if not hints and isinstance(cls, ast.ClassDef):
            # a trainer class builds its criterion in __init__ (CrossEntropyLoss(ignore_index=pad))
            methods = [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
            found = [token_mean_hints(ctx, f) for f in methods]
            hints = any(h for h, _ in found)
            summed = summed or any(sm for _, sm in found)
        if summed and not (by_accelerate or by_engine) and _sums_only_after(ctx, scope, part) \
                and not any(hf_loss(ctx, scope, d) for _, d in by_k):
            summed = False  # a reduction='sum' in a later loop (a reference run), not this
            # loss call (a model's own .loss stays unjudged: its count is not in sight)
        if summed and not explicit and masks_labels(ctx) \
                and all(hf_loss(ctx, scope, d) for _, d in by_k):
            summed = False  # the model's own mean over its label tokens (-100 in sight): a
            # reduction='sum' beside it (a reference loop in the same scope) is another loss
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
                + (f", but it is a mean over the token count of this micro-step alone ({explicit})"
                   if explicit else
                   ", and it looks like a mean over a variable number of tokens (a padding "
                   "or selection mask, or ignore_index, in sight)")
                + ": dividing per-micro-batch means by K weights short micro-batches too much "
                "(mean of means)" + ("" if explicit else " when their token counts differ"),
            )


def _k_divisions(ctx: FileContext, part: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """The loss's divisions by K in ``part`` (a window or its backward helper) that a window
    count does not undo (``num_items_in_batch`` the window's count: not F5)."""
    return [(n, d) for n, d in divides_by_k(ctx, part)
            if not window_normalised(ctx, ctx.scope_of(part), part, d)]


def _sums_only_after(ctx: FileContext, scope: ast.AST, window: ast.AST) -> bool:
    """Every ``reduction="sum"`` of ``scope`` comes after ``window`` ends, in another loop
    (a single-process reference computed after the training)."""
    end = getattr(window, "end_lineno", None) or 0
    sums: list[ast.keyword] = ctx._cached("sum_reductions", scope, lambda: [
        k for k in ctx.local_nodes(scope) if isinstance(k, ast.keyword)
        and k.arg == "reduction" and isinstance(k.value, ast.Constant) and k.value.value == "sum"])
    return bool(sums) and all(getattr(k.value, "lineno", 0) > end
                              and ctx.enclosing(k.value, (ast.For, ast.AsyncFor, ast.While)) is not None
                              for k in sums)


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
                or not is_loss_division(ctx, node, dividend):
            continue
        if _world_only_below(ctx, node, divisor) or _divided_back_by_world(ctx, divisor):
            continue  # loss / (count / W) multiplies by W: the all-reduced count's rank share
        if ctx.mentions_world(dividend):
            continue  # `loss * (world / n_window)`: the W above the line undoes the one below
        if any(isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mult) and any(
            WORLD_RE.search(i) for i in identifiers(s)) for s in walk_all(dividend)):
            continue
        if _under_wrapper_branch(ctx, node) or simulates_ranks(ctx, node) \
                or not flows_to_backward(ctx, node, through_returns=True):
            continue
        if plain_model_only(ctx, dividend):
            continue  # a single-process reference's model: no rank average to undo
        if _multiplied_back_by_world(ctx, node):
            continue  # `loss_sum / global_count * world`: DDP's mean undone on purpose
        yield ctx.finding(
            "AG112",
            node,
            ("the loss is divided by the world size" if ctx.mentions_world(divisor) else
             f"the loss is divided by `{ast.unparse(divisor)}`, a count with the world size as a "
             "factor,")
            + " before backward while the model is wrapped in "
            + ("DDP/FSDP" if ctx.ddp_wrapped else "a DeepSpeed engine" if engine else
               "DDP by accelerator.prepare() on several processes")
            + ", which already averages gradients over ranks: the optimizer receives G / W",
        )


def _multiplied_back_by_world(ctx: FileContext, node: ast.AST) -> bool:
    """The division's result is multiplied by the world size in the same expression
    (``losses.sum() / global_pairs * world``, ``(s / n) * dist.get_world_size()``)."""
    child, cur = node, ctx.parents.get(node)
    while isinstance(cur, ast.BinOp) and isinstance(cur.op, ast.Mult | ast.Div):
        other = cur.right if cur.left is child else cur.left
        if isinstance(cur.op, ast.Mult) and ctx.mentions_world(other):
            return True
        child, cur = cur, ctx.parents.get(cur)
    return False


def _divided_back_by_world(ctx: FileContext, divisor: ast.AST) -> bool:
    """The divisor is a name the file divides by the world size in place after building it
    from it (nanoGPT's ``gradient_accumulation_steps = 5 * 8`` for the whole job, then
    ``gradient_accumulation_steps //= ddp_world_size``): one rank's K, no world size left."""
    name = dotted(divisor) if isinstance(divisor, ast.Name | ast.Attribute) else None
    return name is not None and any(
        isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div | ast.FloorDiv)
        and dotted(n.target) == name and ctx.mentions_world(n.value) for n in ctx.of(ast.AugAssign))


@rule("AG113")
def rank_local_token_mean_under_ddp(ctx: FileContext) -> Iterator[Finding]:
    # a model accelerator.prepare() wraps is DDP whenever the run has several processes
    # (a DeepSpeed engine's backward averages over the data-parallel ranks too)
    ds = not ctx.ddp_wrapped and ctx.deepspeed and any(
        ctx.window_facts(w).engine_backward for w in ctx.windows())
    wrapped = ctx.ddp_wrapped or (ctx.accelerate and ctx.accelerate_prepare) or ds
    by_hand = [] if wrapped else hand_average(ctx)
    if not (wrapped or by_hand) or not ctx.is_training_script() or custom_rank_reduction(ctx):
        return
    if not by_hand:
        yield from _rank_local_num_items(ctx)
    for node, dividend, divisor in [*_divisions(ctx), *reciprocal_products(ctx)]:
        if by_hand and not reaches_hand_average(ctx, node, by_hand):
            continue  # (a reference loop whose gradient no hand-written average touches)
        site = _rank_local_argument(ctx, node, divisor)
        counted = site is not None or is_count(ctx, divisor, micro_batch=False) or (
            isinstance(divisor, ast.Name) and divisor.id in window_sum_names(ctx, node))
        if not counted or not (site is not None or is_loss_division(ctx, node, dividend) or any(
            isinstance(n, ast.Call) and call_attr(n) == "sum" for n in walk_all(dividend)
        )):
            continue
        if ctx.mentions_world(dividend) and not by_hand:
            continue  # `loss_sum * world / n`: the W only undoes the average for a count that
            # spans the ranks (counted from every rank's data, or all-reduced out of sight)
        scope = ctx.scope_of(divisor)  # (a helper's count: `mult = loss_multiplier(window)`)
        count_names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
        reduced = ctx.all_reduced_names(scope) | ctx.all_reduced_names(ctx.tree)
        if count_names & reduced or _made_from_reduced(ctx, count_names, ctx.all_reduced_names(scope)) \
                or _counts_every_rank_slice(ctx, divisor) \
                or _reaches_reduced(ctx, divisor, ctx.all_reduced_names(scope)):
            continue
        if isinstance(divisor, ast.Name) and divisor.id not in ctx.bound_names():
            continue  # made outside the file: whether it spans the ranks is not in sight
        if site is None and _parameter_given_reduced(ctx, node, divisor):
            continue  # every call of the helper passes a count all-reduced where it is made
        if site is not None:
            # a helper's parameter: the count its training call site passes
            # (a method of the file is no module: `self.micro_step(mb, n)` is judged by the
            # loss its body builds)
            local = plain_model_only(ctx, dividend) if isinstance(site.func, ast.Attribute) \
                and dotted(site.func.value) == "self" else plain_model_only(ctx, site)
            if not local and not simulates_ranks(ctx, site) \
                    and flows_to_backward(ctx, node, through_returns=True):
                yield ctx.finding(
                    "AG113", node,
                    f"under DDP/FSDP the loss is divided by `{ast.unparse(divisor)}`, which the "
                    f"call at line {site.lineno} gives as this rank's own count (of tokens or "
                    "samples), never all-reduced: DDP then averages rank-local means, so ranks "
                    "with fewer tokens weigh more")
            continue
        if not ctx.ddp_wrapped and not by_hand and not local_count(ctx, divisor, count_names):
            continue  # under Accelerate: only a count computed here, not named as the window's
        if returned_reduced(ctx, divisor):
            continue  # a helper of the file all-reduces the count it returns
        if _under_wrapper_branch(ctx, node) or not flows_to_backward(ctx, node):
            continue
        if (not by_hand and plain_model_only(ctx, dividend)) or simulates_ranks(ctx, node):
            continue  # a single-process reference (never wrapped, or standing for every rank)
        window = ctx.enclosing(node, (ast.For, ast.AsyncFor, ast.While))
        if window is not None and ctx.is_window(window):
            facts = ctx.window_facts(window)
            if facts.accumulating and divides_by_k(ctx, window):
                continue  # AG104 (F5) reports this loss
        engine = (f"the hand-written gradient average (line {by_hand[0].lineno}: "  # type: ignore[attr-defined]
                  f"`{ast.unparse(by_hand[0])}`)" if by_hand else "DeepSpeed" if ds else "DDP")
        under = ("a hand-written average over ranks" if by_hand else "a DeepSpeed engine" if ds
                 else "DDP/FSDP")
        yield ctx.finding(
            "AG113",
            node,
            f"under {under} the "
            f"loss is divided by `{ast.unparse(divisor)}`{_helper_note(ctx, node, divisor)}, "
            f"this rank's own count (of tokens or "
            f"samples), which is never all-reduced: {engine} then averages rank-local means, "
            "so ranks with fewer tokens weigh more",
        )


def _counts_every_rank_slice(ctx: FileContext, divisor: ast.AST) -> bool:
    """The count reads a slice of the data whose bounds are sized by the world size
    (``labels[s * K * W * m:(s + 1) * K * W * m]``): every rank's share of the window,
    counted from data each rank holds whole."""
    fn: ast.AST | None = ctx.enclosing(divisor, FUNCS) or ctx.tree
    exprs = [divisor]
    if isinstance(divisor, ast.Name) and fn is not None:
        exprs += ctx.assigned_in(fn).get(divisor.id, [])
    return sized_slice(ctx, fn, exprs, through_names(ctx, fn, ctx.mentions_world)) \
        or _indexed_by_window_slice(ctx, fn, exprs)


def _indexed_by_window_slice(ctx: FileContext, fn: ast.AST | None, exprs: list[ast.AST]) -> bool:
    """The count reads ``data[ws, ...]`` with ``ws`` a slice a helper of the file returns,
    ``return slice(lo, hi)``, both bounds sized by the world size and neither by the rank
    (``window_slice(step, world, K, mb)``): every rank's share of the window."""
    def window_slicer(call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        defs = ctx.functions_by_name().get(call_attr(call) or "", [])
        if len(defs) != 1:
            return False
        rets = [r.value for r in ast.walk(defs[0]) if isinstance(r, ast.Return) and r.value is not None]
        return len(rets) == 1 and isinstance(rets[0], ast.Call) and call_attr(rets[0]) == "slice" \
            and len(rets[0].args) == 2 and all(
                ctx.mentions_world(b) and not any(
                    isinstance(n, ast.Name) and "rank" in n.id.lower() for n in walk_all(b))
                for b in rets[0].args)

    for e in exprs:
        for sub in walk_all(e):
            if not isinstance(sub, ast.Subscript):
                continue
            parts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            for part in parts:
                values = [part] if isinstance(part, ast.Call) else (
                    ctx.assigned_in(fn).get(part.id, []) if isinstance(part, ast.Name)
                    and fn is not None else [])
                if values and all(window_slicer(v) for v in values):
                    return True
    return False


def _made_from_reduced(ctx: FileContext, names: set[str], reduced: set[str]) -> bool:
    """A count name every (non-None) value of which reads a name all-reduced in the same
    function, outside a comprehension (``denom = cnt / world`` after
    ``dist.all_reduce(cnt)``): the count spans the ranks."""
    by_name = ctx.values_by_name()
    for name in names:
        values = [v for v in by_name.get(name, [])
                  if not (isinstance(v, ast.Constant) and v.value is None)]
        if values and all(any((dotted(x) or "") in reduced for x in _outside_comprehensions(v))
                          for v in values):
            return True
    return False


def _reaches_reduced(ctx: FileContext, divisor: ast.AST, reduced: set[str]) -> bool:
    """The divisor is a name whose assignment reaching the division reads an all-reduced name
    (``n = sum(...)``, then ``dist.all_reduce(t)`` and ``n = t.item() / world``: the count the
    division sees spans the ranks, whatever the name held before)."""
    if not isinstance(divisor, ast.Name):
        return False
    write = ctx.reaching_write(ctx.scope_of(divisor), divisor.id, divisor)
    return isinstance(write, ast.Assign) and any(
        (dotted(x) or "") in reduced for x in _outside_comprehensions(write.value))


def _outside_comprehensions(expr: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``expr`` not inside a comprehension (whose names are its own)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node)
                     if not isinstance(c, ast.GeneratorExp | ast.ListComp | ast.SetComp | ast.DictComp))


def _helper_note(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> str:
    """Where a count of another function comes from (a multiplier a helper returns)."""
    fn = ctx.enclosing(divisor, FUNCS)
    if fn is None or fn is ctx.enclosing(node, FUNCS):
        return ""
    return f" (through the factor `{getattr(fn, 'name', '?')}()` returns, line {getattr(divisor, 'lineno', 0)})"


def _rank_local_num_items(ctx: FileContext) -> Iterator[Finding]:
    """``model(**batch, num_items_in_batch=n)`` (a transformers model divides its summed loss
    by it) with ``n`` a token count this rank made of its window (assigned once in the
    function, from a count or a file helper returning one), gathered or all-reduced nowhere,
    under DDP: each rank normalises by its own tokens and DDP averages the ranks' means."""
    for call in ctx.of(ast.Call):
        kw = next((k for k in call.keywords if k.arg == "num_items_in_batch"), None)
        if kw is None or not isinstance(kw.value, ast.Name):
            continue
        fn = ctx.enclosing(call, FUNCS)
        values = ctx.assigned_in(fn).get(kw.value.id, []) if fn is not None else []
        if len(values) != 1 or not _counted_here(ctx, values[0]):
            continue
        reduced = ctx.all_reduced_names(fn) | ctx.all_reduced_names(ctx.tree) if fn else set()
        if kw.value.id in reduced or returned_reduced(ctx, kw.value) or simulates_ranks(ctx, call) \
                or plain_model_only(ctx, call) or ctx.mentions_world(values[0]):
            continue
        yield ctx.finding(
            "AG113", kw.value,
            f"under DDP/FSDP the model divides its summed loss by `num_items_in_batch` = "
            f"`{ast.unparse(values[0])}`, this rank's own count of tokens, which is never "
            "all-reduced: DDP then averages rank-local means, so ranks with fewer tokens weigh "
            "more",
            fix="count the window's tokens over every rank (`accelerator.gather(n).sum()` or "
                "`dist.all_reduce(n)`) and multiply the loss by the number of processes, as "
                "the HF Trainer does with average_tokens_across_devices")


def _counted_here(ctx: FileContext, value: ast.AST) -> bool:
    """``value`` counts tokens itself, or calls a function of the file that returns a count."""
    if counts_tokens(value) and not isinstance(value, ast.Name | ast.Attribute):
        return True
    if isinstance(value, ast.Call):
        defs = ctx.functions_by_name().get(call_attr(value) or "", [])
        return len(defs) == 1 and any(
            isinstance(r, ast.Return) and r.value is not None and counts_tokens(r.value)
            and not any(isinstance(c, ast.Call) and (call_attr(c) or "") in
                        ("all_reduce", "gather", "all_gather", "reduce") for c in walk_all(r.value))
            for r in ast.walk(defs[0]))
    return False


def _passed_for(ctx: FileContext, node: ast.AST, divisor: ast.AST
                ) -> list[tuple[ast.Call, ast.AST | None]] | None:
    """When ``divisor`` is a parameter of the function around ``node`` (not assigned in it):
    each call of that function with the argument it passes for it (None when not readable);
    else None."""
    fn = ctx.enclosing(node, FUNCS)
    if not isinstance(divisor, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if divisor.id not in params or divisor.id in _assigned_in(fn):
        return None
    at = params.index(divisor.id) - (1 if params and params[0] in ("self", "cls") else 0)
    out: list[tuple[ast.Call, ast.AST | None]] = []
    for call in ctx.call_sites(fn):
        arg = next((k.value for k in call.keywords if k.arg == divisor.id), None)
        if arg is None and 0 <= at < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[:at + 1]):
            arg = call.args[at]
        out.append((call, arg))
    return out


def _rank_local_argument(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> ast.Call | None:
    """``divisor`` is a parameter of the function around ``node`` (``def compute_loss(model,
    batch, n): ... / n``), and a call of that function passes it a count this rank made of
    its own micro-batches (``n = sum((b["labels"] != -100).sum() for b in mine)``), all-reduced
    nowhere: that call, else None. A name assigned in the function is not a parameter."""
    for call, arg in _passed_for(ctx, node, divisor) or []:
        if not isinstance(arg, ast.Name):
            continue
        names = {arg.id}
        counted = arg.id in window_sum_names(ctx, call) or (
            is_count(ctx, arg, micro_batch=False) and local_count(ctx, call, names))
        reduced = names & (ctx.all_reduced_names(ctx.scope_of(call)) | ctx.all_reduced_names(ctx.tree))
        if counted and not reduced and not returned_reduced(ctx, arg):
            return call
    return None


def _parameter_given_reduced(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """``divisor`` is a parameter of the function around ``node`` that every call of it
    passes a name all-reduced in the caller (``dist.all_reduce(n); self.micro_step(mb, n)``)."""
    passed = _passed_for(ctx, node, divisor)
    return bool(passed) and all(
        isinstance(arg, ast.Name) and arg.id in ctx.all_reduced_names(ctx.scope_of(call))
        for call, arg in passed or [])


def _assigned_in(fn: ast.AST) -> set[str]:
    return {t.id for a in ast.walk(fn) if isinstance(a, ast.Assign | ast.AugAssign | ast.AnnAssign)
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target]) if isinstance(t, ast.Name)}
