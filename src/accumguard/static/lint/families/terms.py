"""Loss terms (LOSS_SCALE): one term of a summed loss divided by K, another not.

AG127: in a hand-written accumulation window the backwarded loss is a sum of terms, one of
them divided by K (the accumulation count: ``ce / accumulation_steps``) and another added
after that division or beside it undivided (``loss = ce / K + aux_coef * aux``, or
``loss = ce / K`` then ``loss = loss + aux_coef * aux`` / ``loss += z_loss``). Over the K
micro-batches of a window the divided term adds up to its large-batch mean, the other to K
times its mean: the auxiliary (router, load-balancing, z-loss, regulariser) term weighs K
times its coefficient relative to the main term. The terms are read from the
assignments to the backwarded name in the window, in order (one level: ``loss = loss + x``,
``loss += x``, ``loss = loss / K``, ``loss /= K``). Not judged: Accelerate, DeepSpeed and
Lightning automatic-optimisation backwards (they divide the whole loss themselves; a
``self.manual_backward`` in a module with ``automatic_optimization = False`` is judged:
Lightning divides nothing there), a term that is a constant, a
window whose loss cannot be followed (a name assigned in a branch or loop the backward is
not inside, a helper), a term with
any division of its own (``ce_sum / window_tokens``: normalised by the window's count).

A term that is a local name (``lm_loss = lm_loss / K`` then ``loss = lm_loss + coef * aux``)
is followed to its own assignments in the window before it is used (a few levels): a name
that is a sum splices its terms in; a name inside a product (``coef * aux`` after
``aux = aux / K``) makes the product divided when all of the name's terms are divided, and
normalised when any of them carries a division. A name that cannot be followed stays one
opaque, undivided term (as before).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    COUNT_NAME_RE,
    call_attr,
    dotted,
    is_backward,
    mult_factors,
    position,
    receiver,
    walk_all,
    walk_local,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import manual_optimization
from accumguard.static.lint.families._lossexpr import is_mean_call, returned_by_call, unpacked
from accumguard.static.lint.families._masked import (
    counted_per_micro_batch,
    counts_tokens,
    counts_window,
)
from accumguard.static.lint.families.deepspeed import _config_ga


@dataclass
class _Term:
    expr: ast.AST
    divided: bool  # divided by K
    normalised: bool = False  # carries some division of its own (window count, ...)


_DEPTH = 3  # how many levels of local names a term is followed through


def _is_k(ctx: FileContext, expr: ast.AST, k_names: set[str]) -> bool:
    """``expr`` is (or is built from) the accumulation count: a name that says so, or one
    of the names the window's boundary reads K from."""
    return ctx.mentions_accum(expr) or any(dotted(n) in k_names for n in walk_all(expr))


def _divides_by_k(ctx: FileContext, node: ast.AST, k_names: set[str]) -> bool:
    if isinstance(node, ast.Call):
        return _helper_divides_by_k(ctx, node, k_names)
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.FloorDiv)
            and _is_k(ctx, node.right, k_names))


def _helper_divides_by_k(ctx: FileContext, call: ast.Call, k_names: set[str]) -> bool:
    """``scale_for_accumulation(ce, K)``: a call of the file's one function of that name
    whose every ``return`` divides by one of its parameters, given K for it."""
    name = call.func.id if isinstance(call.func, ast.Name) else (
        call.func.attr if isinstance(call.func, ast.Attribute) else None)
    fns = ctx.defs_by_name().get(name or "", [])
    if len(fns) != 1:
        return False
    fn = fns[0]
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    rets = [n for n in walk_local(fn) if isinstance(n, ast.Return)]
    if rets and all(isinstance(r.value, ast.BinOp) and isinstance(r.value.op, ast.Div)
                    and not isinstance(r.value.right, ast.Name) and ctx.mentions_accum(r.value.right)
                    for r in rets):
        return True  # `return mse(...) / self.args.accum`: divided by K inside
    if not rets or not all(isinstance(r.value, ast.BinOp) and isinstance(r.value.op, ast.Div)
                           and isinstance(r.value.right, ast.Name) for r in rets):
        return False
    divisors = {r.value.right.id for r in rets}  # type: ignore[union-attr]
    if len(divisors) != 1:
        return False
    (param,) = divisors
    bound = [a for i, a in enumerate(call.args) if i < len(params) and params[i] == param
             and not isinstance(a, ast.Starred)]
    bound += [kw.value for kw in call.keywords if kw.arg == param]
    return len(bound) == 1 and _is_k(ctx, bound[0], k_names)


def _has_k_division(ctx: FileContext, expr: ast.AST, k_names: set[str]) -> bool:
    return any(_divides_by_k(ctx, n, k_names) for n in walk_all(expr))


class _Follow:
    """Follows local names to their terms in one window, before the statement using them."""

    def __init__(self, ctx: FileContext, window: ast.AST, k_names: set[str]) -> None:
        self.ctx, self.window = ctx, window
        self.k = k_names
        self.active: set[str] = set()

    def name_terms(self, name: str, at: ast.AST, depth: int) -> list[_Term] | None:
        if depth <= 0 or name in self.active:
            return None
        self.active.add(name)
        try:
            return self.terms_at(name, at, depth - 1)
        finally:
            self.active.discard(name)

    def term(self, expr: ast.AST, at: ast.AST, depth: int) -> _Term:
        """One non-sum term; the local names inside it decide whether it is divided."""
        divided, normalised = _has_k_division(self.ctx, expr, self.k), False
        for n in walk_all(expr):
            if n is expr:
                continue
            sub = self.name_terms(n.id, at, depth) if isinstance(n, ast.Name) else None
            if sub:
                divided = divided or all(t.divided for t in sub)
                normalised = normalised or any(t.normalised or _divided_by_anything(t.expr) for t in sub)
            elif isinstance(n, ast.Name | ast.Attribute) and self.coefficient_over_k(n):
                divided = True
        return _Term(expr, divided, normalised)

    def coefficient_over_k(self, node: ast.Name | ast.Attribute) -> bool:
        """A name every assignment of which (in the whole file) divides by K: a coefficient
        that already carries the 1/K (``z_scale = z_coef / K``, ``self.aux_w = w / accum``)."""
        name = dotted(node)
        values = self.ctx.values_by_name().get(name, []) if name is not None else []
        return bool(values) and all(_has_k_division(self.ctx, v, self.k) for v in values)

    def split(self, expr: ast.AST, name: str, prev: list[_Term] | None, at: ast.AST,
              depth: int) -> list[_Term] | None:
        """The additive terms of ``expr`` (a subtracted one too: ``loss - ent_coef * ent``);
        ``name`` (the loss itself, ``loss = loss + x``) stands for ``prev``. None when it
        cannot be followed (``name`` unknown, a subtraction of it)."""
        if dotted(expr) == name:
            return None if prev is None else [_Term(t.expr, t.divided, t.normalised) for t in prev]
        if isinstance(expr, ast.BinOp) and (isinstance(expr.op, ast.Add) or (
                isinstance(expr.op, ast.Sub) and not any(dotted(n) == name
                                                         for n in walk_all(expr.right)))):
            left = self.split(expr.left, name, prev, at, depth)
            right = self.split(expr.right, name, prev, at, depth)
            return None if left is None or right is None else left + right
        if _divides_by_k(self.ctx, expr, self.k) and isinstance(expr, ast.BinOp):
            inner = self.split(expr.left, name, prev, at, depth)
            return None if inner is None else [_Term(t.expr, True, t.normalised) for t in inner]
        if any(dotted(n) == name for n in walk_all(expr)):
            return None  # the loss inside a product or a call: not a plain sum
        if isinstance(expr, ast.Name):
            sub = self.name_terms(expr.id, at, depth)
            if sub:  # a term read from a tuple unpacking has no place: the name's own
                return [t if hasattr(t.expr, "lineno") else _Term(expr, t.divided, t.normalised)
                        for t in sub]
        if isinstance(expr, ast.Call) and depth > 0 and not _helper_divides_by_k(self.ctx, expr, self.k):
            sub = self.returned_terms(expr, depth)
            if sub is not None and len(sub) >= 2:
                return sub  # `self.training_step(x, y)` returning `task + penalty`
        return [self.term(expr, at, depth)]

    def returned_terms(self, call: ast.Call, depth: int) -> list[_Term] | None:
        """The terms of the one ``return`` of the file's function ``call`` calls (followed in
        that function, one level less deep), or None."""
        fn = self.ctx.callee_of(call)
        if fn is None or fn is self.window:
            return None
        rets = [n for n in walk_local(fn) if isinstance(n, ast.Return) and n.value is not None]
        if len(rets) != 1:
            return None
        inner = _Follow(self.ctx, fn, self.k)
        inner.active = set(self.active)
        value = rets[0].value
        assert value is not None
        return inner.split(value, "", None, rets[0], depth - 1)

    def terms_at(self, name: str, use: ast.AST, depth: int = _DEPTH) -> list[_Term] | None:
        """The terms of ``name`` when ``use`` runs, from the window's assignments before it
        (all in ``use``'s own block: one inside an ``if`` makes the sum undecidable)."""
        ctx = self.ctx
        terms: list[_Term] | None = None
        here = position(use)
        writes = [n for n in _writes(ctx, self.window).get(name, ()) if position(n) < here]
        use_blocks = _blocks(ctx, use)
        for w in sorted(writes, key=position):
            if _blocks(ctx, w)[0] not in use_blocks and not (
                    terms is not None and _added_under_if(ctx, w, name, use_blocks)):
                return None  # written in a branch or loop the use is not inside: undecidable
            if isinstance(w, ast.Assign):
                if len(w.targets) != 1:
                    return None
                helper = isinstance(w.value, ast.Call) and _helper_divides_by_k(ctx, w.value, self.k)
                returned = returned_by_call(ctx, w, name) if depth > 0 and not helper else None
                if returned is not None:  # `loss, ce = self.compute_loss(x)`: its terms there
                    expr, fn, ret = returned
                    inner = _Follow(ctx, fn, self.k)
                    terms = (inner.terms_at(expr.id, ret, depth - 1) if isinstance(expr, ast.Name)
                             else inner.split(expr, "", None, ret, depth - 1))
                    if not terms:
                        terms = [_Term(ast.Name(name), False)]
                    continue
                if dotted(w.targets[0]) != name:  # `logits, loss, aux = model(x)`: one fresh term
                    terms = [_Term(ast.Name(name), False)]
                    continue
                terms = self.split(w.value, name, terms, w, depth)
            elif terms is None:
                return None
            elif isinstance(w.op, ast.Add | ast.Sub):
                extra = self.split(w.value, name, None, w, depth)
                terms = None if extra is None else terms + extra
            elif isinstance(w.op, ast.Div) and _is_k(ctx, w.value, self.k):
                terms = [_Term(t.expr, True, t.normalised) for t in terms]
            else:
                return None
            if terms is None:
                return None
        return terms


def _added_under_if(ctx: FileContext, w: ast.AST, name: str,
                    use_blocks: list[tuple[int, str]]) -> bool:
    """``loss = loss + x`` / ``loss += x`` in the body of an ``if`` (no ``else``) that is
    itself in the use's block: when the branch runs, ``x`` is one more term of the loss (a
    distillation term added when a teacher is given); judged as if it ran."""
    if isinstance(w, ast.AugAssign):
        adds = isinstance(w.op, ast.Add | ast.Sub)
    elif isinstance(w, ast.Assign) and len(w.targets) == 1 and dotted(w.targets[0]) == name:
        v = w.value
        adds = isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add | ast.Sub) \
            and dotted(v.left) == name
    else:
        adds = False
    branch = ctx.parents.get(w)
    return (adds and isinstance(branch, ast.If) and not branch.orelse
            and any(c is w for c in branch.body) and _blocks(ctx, branch)[0] in use_blocks
            and _setting(ctx, branch.test))


def _setting(ctx: FileContext, test: ast.AST) -> bool:
    """An ``if`` on a setting of the run, not on the step (``if self.teacher is not None``,
    ``if args.use_aux``, ``if self.ent_coef > 0``, ``if cfg["kd_weight"] > 0``): a name or
    field (or a string key of one) the enclosing function never assigns, tested for truth or against a number, or any name tested against None. A term added under a test of the step or micro-step counter
    (``if (i + 1) % K == 0``: once per window, at its full weight) is not one of these."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    none_test = False
    if isinstance(test, ast.Compare):
        if not (len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant)):
            return False
        none_test = (isinstance(test.ops[0], ast.Is | ast.IsNot)
                     and test.comparators[0].value is None)
        if not none_test and not isinstance(test.comparators[0].value, int | float):
            return False
        test = test.left
    if isinstance(test, ast.Subscript) and isinstance(test.slice, ast.Constant) \
            and isinstance(test.slice.value, str):
        test = test.value  # `cfg["kd_weight"]`: a setting when `cfg` is one
    name = dotted(test) if isinstance(test, ast.Name | ast.Attribute) else None
    if name is None or ctx.mentions_accum(test):
        return False
    if none_test:
        return True  # present or not, the same in every micro-step (`if aux is not None`)
    fn = ctx.enclosing(test, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    return name not in _assigned(ctx, fn if fn is not None else ctx.tree)


def _assigned(ctx: FileContext, scope: ast.AST) -> set[str]:
    """The names and fields ``scope`` assigns or loops over (once per scope)."""
    def compute() -> set[str]:
        return {d for n in ast.walk(scope) if isinstance(n, ast.Assign | ast.AugAssign | ast.For
                                                           | ast.AsyncFor)
                for t in _loop_or_targets(n) if (d := dotted(t)) is not None}
    return ctx._cached("terms_assigned", scope, compute)  # type: ignore[no-any-return]


def _loop_or_targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.For | ast.AsyncFor):
        t = node.target
        return list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
    return _targets(node)  # type: ignore[arg-type]


_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_CONTROL = (ast.If, ast.Try, ast.Match, *_LOOPS)


def _blocks(ctx: FileContext, node: ast.AST) -> list[tuple[int, str]]:
    """The statement lists around ``node``, innermost first, as (control node id, field):
    ``if``'s body and its ``else`` are different blocks. A write whose innermost block is one
    of the use's blocks runs before the use on every path that reaches it (the loss assigned
    in the loop body, the backward inside ``if``/``else`` with or without ``no_sync``)."""
    out: list[tuple[int, str]] = []
    child, cur = node, ctx.parents.get(node)
    while cur is not None:
        if isinstance(cur, _CONTROL):
            field = next((f for f in cur._fields if isinstance(getattr(cur, f, None), list)
                          and any(c is child for c in getattr(cur, f))), "")
            out.append((id(cur), field))
        if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            break
        child, cur = cur, ctx.parents.get(cur)
    out.append((0, "scope"))
    return out


def _writes(ctx: FileContext, window: ast.AST) -> dict[str, list[ast.Assign | ast.AugAssign]]:
    """The window's assignments by target name, in source order (built once per window:
    a term is followed through several names, each looked up here)."""
    def compute() -> dict[str, list[ast.Assign | ast.AugAssign]]:
        out: dict[str, list[ast.Assign | ast.AugAssign]] = {}
        for n in ctx.local_nodes(window):
            if isinstance(n, ast.Assign | ast.AugAssign):
                for name in {d for t in _targets(n) if (d := dotted(t)) is not None}:
                    out.setdefault(name, []).append(n)
        return out
    return ctx._cached("terms_writes", window, compute)  # type: ignore[no-any-return]


def _targets(node: ast.Assign | ast.AugAssign) -> list[ast.AST]:
    """The names an assignment writes, tuple targets unpacked one level."""
    out: list[ast.AST] = []
    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
        out += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
    return out


def _constant(expr: ast.AST) -> bool:
    """A constant, or ``0 * x`` (DDP's unused-parameter trick adds no gradient)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult) and any(
            isinstance(side, ast.Constant) and side.value == 0 for side in (expr.left, expr.right)):
        return True
    return all(isinstance(n, ast.Constant | ast.operator | ast.unaryop | ast.BinOp | ast.UnaryOp)
               for n in walk_all(expr))


def _divided_by_anything(expr: ast.AST) -> bool:
    """The term carries a division of its own: at its top (``ce_sum / n_window``, through
    products, signs and the receiver of a ``.sum()``), not inside a call's
    arguments (``kl_div(log_softmax(s / T), ...)``: a temperature, not a normalisation)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.Div | ast.FloorDiv):
                return True
            stack += [e.left, e.right]
        elif isinstance(e, ast.UnaryOp):
            stack.append(e.operand)
        elif isinstance(e, ast.Call) and call_attr(e) == "sum":
            # (not through a `.mean()`: `(logp / lengths).mean()` is a mean over the
            # micro-batch, whatever divides its elements)
            if isinstance(e.func, ast.Attribute) and dotted(e.func.value) != "torch":
                stack.append(e.func.value)
            elif e.args:
                stack.append(e.args[0])
    return False


def _manual(ctx: FileContext, call: ast.AST) -> bool:
    """``self.manual_backward`` in a class that sets ``automatic_optimization = False``:
    Lightning divides nothing there (it divides only what automatic optimisation backwards)."""
    cls = ctx.enclosing(call, (ast.ClassDef,))
    return isinstance(cls, ast.ClassDef) and manual_optimization(cls)


def _engine_divides_by_one(ctx: FileContext, window: ast.AST) -> bool:
    """A DeepSpeed engine whose config in sight sets gradient_accumulation_steps to 1 (or
    leaves it out): its ``engine.backward`` divides the loss by nothing, so the loop's own
    K-division is the only one (the documented GA > 1 loop is AG134's)."""
    ref = ctx.ds_config()
    return ref is not None and _config_ga(ctx, ref, ctx.window_k_names(window))[0] == "one"


@rule("AG127")
def loss_term_not_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        engine_by_one = facts.engine_backward and _engine_divides_by_one(ctx, window)
        if (not facts.accumulating or facts.summed_loss or facts.unguarded_optimizer_steps
                or facts.accelerate or (facts.engine_backward and not engine_by_one)
                or ctx.window_k_is_one(window)):
            continue
        yield from _separate_backwards(ctx, window)
        for scope, bw in ctx.backward_scopes(window):
            if call_attr(bw) == "manual_backward" and len(bw.args) == 1 and _manual(ctx, bw):
                loss: ast.AST | None = bw.args[0]  # Lightning leaves the scale to the module
            elif (engine_by_one and call_attr(bw) == "backward" and len(bw.args) == 1
                  and ctx.kind_of_receiver(receiver(bw)) == "engine"):
                loss = bw.args[0]  # DeepSpeed with GA = 1 divides by nothing
            elif call_attr(bw) != "backward" or bw.args:
                continue
            else:
                loss = receiver(bw)
            if isinstance(loss, ast.Call) and call_attr(loss) == "scale" and len(loss.args) == 1:
                loss = loss.args[0]  # scaler.scale(loss).backward()
            if loss is None:
                continue
            name = dotted(loss)
            # a helper's backward: its loss is followed in the helper (the window's K still)
            follow = _Follow(ctx, scope if scope in ctx.inlined(window) else window,
                             ctx.window_k_names(window))
            terms = (follow.terms_at(name, bw) if name is not None
                     else follow.split(loss, "", None, bw, _DEPTH))
            if not terms or len(terms) < 2:
                continue
            divided = [t for t in terms if t.divided]
            if not divided:
                yield from _micro_mean_beside_window_count(ctx, window, terms)
                continue
            for t in terms:
                if t.divided or t.normalised or _constant(t.expr) or _divided_by_anything(t.expr) \
                        or _from_counted_call(ctx, window, t.expr):
                    continue  # a term over the window's token count (`ce_sum / n_window`) is right
                main = ast.unparse(divided[0].expr)
                yield ctx.finding(
                    "AG127",
                    t.expr,
                    f"the loss term `{ast.unparse(t.expr)}` is not divided by K while `{main}` is: "
                    "summed over the window's K micro-batches it weighs K times its coefficient "
                    "relative to the large batch's loss",
                )


def _from_counted_call(ctx: FileContext, window: ast.AST, expr: ast.AST) -> bool:
    """A term named by the window's one assignment from a call given a count
    (``loss_ce, loss_bbox = criterion(logits, boxes, targets, num_boxes)``): the callee may
    normalise by that count (a window count: right without K), so the term is not judged."""
    if not isinstance(expr, ast.Name):
        return False
    writes = _writes(ctx, window).get(expr.id, [])
    if len(writes) != 1 or not isinstance(writes[0], ast.Assign) \
            or not isinstance(writes[0].value, ast.Call):
        return False
    call = writes[0].value
    args = [*call.args, *(k.value for k in call.keywords)]
    return any(COUNT_NAME_RE.match(last) for a in args
               if (d := dotted(a)) is not None and (last := d.split(".")[-1]))


def _own_division(ctx: FileContext, window: ast.AST, expr: ast.AST, depth: int = 2
                  ) -> tuple[ast.AST, ast.AST] | None:
    """The (numerator, divisor) of the division at the top of a term (through products,
    signs, and a local name the window assigns once: ``coef * z_loss`` after ``z_loss =
    (z * m).sum() / m.sum()``)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.Div):
                return e.left, e.right
            if isinstance(e.op, ast.Mult):
                stack += [e.left, e.right]
        elif isinstance(e, ast.UnaryOp):
            stack.append(e.operand)
        elif isinstance(e, ast.Name) and depth > 0:
            writes = _writes(ctx, window).get(e.id, [])
            if len(writes) == 1 and isinstance(writes[0], ast.Assign) and len(writes[0].targets) == 1:
                found = _own_division(ctx, window, writes[0].value, depth - 1)
                if found is not None:
                    return found
    return None


def _micro_mean_beside_window_count(ctx: FileContext, window: ast.AST, terms: list[_Term]
                                    ) -> Iterator[Finding]:
    """No term is divided by K, one is normalised by a count of the whole window
    (``ce_sum / n_window_tokens``, counted before the micro-batches) and another is a mean
    over one micro-batch's own count (``(z * m).sum() / m.sum()``): over the K micro-batches
    the window-normalised term adds up to its large-batch mean, the per-micro-batch mean to
    K times its own."""
    scope = ctx.window_scope(window)
    window_terms: list[ast.AST] = []
    micro_terms: list[tuple[_Term, str]] = []
    for t in terms:
        d = _own_division(ctx, window, t.expr)
        if _constant(t.expr):
            continue
        if d is None:
            mean = _micro_mean_factor(ctx, scope, t.expr)
            if mean is not None:
                micro_terms.append((t, mean))
            continue
        num, den = d
        per_micro = counted_per_micro_batch(ctx, scope, window, den)
        if not per_micro and (counts_tokens(den) or counts_window(ctx, den)):
            window_terms.append(t.expr)
        elif per_micro and (counts_tokens(den) or _masked_shape(num, den)):
            micro_terms.append((t, f"divided by `{ast.unparse(den)}`, counted per micro-step"))
    if not window_terms:
        return
    for t, how in micro_terms:
        yield ctx.finding(
            "AG127",
            t.expr,
            f"the loss term `{ast.unparse(t.expr)}` is a mean over one micro-batch ({how}) "
            "and not divided by K, while "
            f"`{ast.unparse(window_terms[0])}` is normalised by the window's count: summed over "
            "the window's K micro-batches it weighs K times its coefficient relative to the "
            "large batch's loss",
            fix="normalise that term by the same window count as the main term (its sum over "
                "the micro-batch divided by the window's count), or divide it by K",
        )


def _micro_mean_factor(ctx: FileContext, scope: ast.AST, expr: ast.AST) -> str | None:
    """The one factor of a product of a term (``AUX_W * aux``) that is a mean over its
    micro-batch, the others numbers or names that are not: inline, or a name bound from
    a function of the file whose return holds one (``main_sum, aux = losses(model, batch)``
    with ``aux = F.cross_entropy(...)`` there), in words. None otherwise."""
    factors = mult_factors(expr)
    means = [(f, m) for f in factors if (m := _mean_of(ctx, scope, f)) is not None]
    rest = [f for f in factors if all(f is not g for g, _ in means)]
    if len(means) != 1 or not all(isinstance(f, ast.Constant | ast.Name | ast.Attribute)
                                  for f in rest):
        return None
    factor, mean = means[0]
    what = f"`{ast.unparse(mean)}`"
    return what if factor is mean else f"`{ast.unparse(factor)}` is {what}"


def _mean_of(ctx: FileContext, scope: ast.AST, e: ast.AST) -> ast.AST | None:
    if is_mean_call(e):
        return e
    if not isinstance(e, ast.Name):
        return None
    got = unpacked(ctx, scope, e)
    if got is e:
        return None
    if isinstance(got, ast.Name):  # the helper's own name for it: its one assignment there
        fn = ctx.enclosing(got, (ast.FunctionDef, ast.AsyncFunctionDef))
        binds = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Assign)
                 and len(n.targets) == 1 and dotted(n.targets[0]) == got.id] if fn else []
        got = binds[0].value if len(binds) == 1 else got
    return got if is_mean_call(got) else None


def _masked_shape(num: ast.AST, den: ast.AST) -> bool:
    """``(x * m).sum() / m.sum()``: the divisor is built from names the summed numerator
    also reads (a masked mean)."""
    den_names = {n.id for n in walk_all(den) if isinstance(n, ast.Name)}
    num_names = {n.id for n in walk_all(num) if isinstance(n, ast.Name)}
    return bool(den_names) and den_names < num_names and any(
        isinstance(c, ast.Call) and call_attr(c) == "sum" for c in walk_all(num))


def _backward_loss(ctx: FileContext, bw: ast.Call) -> ast.AST | None:
    """The loss a plain ``.backward()`` call backwards (``scaler.scale(x).backward()``: x)."""
    if call_attr(bw) != "backward" or bw.args:
        return None
    loss = receiver(bw)
    if isinstance(loss, ast.Call) and call_attr(loss) == "scale" and len(loss.args) == 1:
        loss = loss.args[0]
    return loss


def _separate_backwards(ctx: FileContext, window: ast.AST) -> Iterator[Finding]:
    """Two backwards in one micro-step of the window (a term backwarded on its own, with
    ``retain_graph=True`` on the first): one loss divided by K, another with no division at
    all. Over the K micro-batches the second weighs K times its coefficient."""
    calls = [n for n in ctx.local_nodes(window) if isinstance(n, ast.Call) and is_backward(n)
             and ctx.enclosing(n, _LOOPS) is window]
    if len(calls) < 2:
        return
    facts = ctx.window_facts(window)
    if facts.own_rate or facts.unguarded_optimizer_steps or any(
            not ctx.guarded(z, window) for z, _ in facts.zero_grads):
        return  # (a GAN's discriminator, a critic: another optimizer's loss, its own window)
    k = ctx.window_k_names(window)
    follow = _Follow(ctx, window, k)
    block = _blocks(ctx, calls[0])[0]
    read: list[tuple[ast.Call, ast.AST, bool, bool]] = []
    for bw in calls:
        loss = _backward_loss(ctx, bw)
        if loss is None or _blocks(ctx, bw)[0] != block:
            return  # (a backward in a branch of its own: alternatives, not two terms)
        name = dotted(loss)
        terms = follow.terms_at(name, bw) if name is not None else follow.split(loss, "", None, bw, _DEPTH)
        if not terms:
            return
        divided = all(t.divided for t in terms)
        plain = not any(t.divided or t.normalised or _divided_by_anything(t.expr) or _constant(t.expr)
                        for t in terms) and not _divided_by_anything(loss)
        read.append((bw, loss, divided, plain))
    main = next(((bw, loss) for bw, loss, d, _ in read if d), None)
    if main is None:
        return
    for bw, loss, _, plain in read:
        if plain:
            yield ctx.finding(
                "AG127",
                bw,
                f"`{ast.unparse(loss)}` is backwarded on its own in every micro-step and not "
                f"divided by K, while `{ast.unparse(main[1])}` (line {main[0].lineno}) is: "
                "summed over the window's K micro-batches that term weighs K times its "
                "coefficient relative to the large batch's loss",
                fix="divide that loss by K as well before its backward (or add it to the main "
                    "loss before the division)",
            )
