"""Boundary questions of a lint file context: is this test the accumulation boundary, with
which polarity, and is a call only reached there (rule 3 of :mod:`._context`)?"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from typing import TYPE_CHECKING

from accumguard.static.lint._ast import (
    ACCUM_RE,
    BOUNDARY_RE,
    POSITIVE_BOUNDARY_RE,
    call_attr,
    dotted,
    has_backward,
    has_mod,
    last_part,
    terminates,
    walk_all,
    walk_local,
)
from accumguard.static.lint._ctx_file import FileIndex


class BoundaryFacts(FileIndex):
    """Boundary tests, boundary flags and guards, on top of the file index."""

    if TYPE_CHECKING:  # :class:`._ctx_windows.WindowQueries`' own, above this in the context
        def inlined(self, window: ast.AST) -> dict[ast.AST, ast.Call]: ...

    def _ensure_boundary_flags(self) -> None:
        """Names assigned from a boundary test (``is_last = k == K - 1``), to a fixpoint."""
        if self._flags_ready:
            return
        self._flags_ready = True
        flags = self.boundary_flags
        for _ in range(4):
            before = len(flags)
            for names, value in self._assigns:
                if names and not flags.issuperset(names) and self._boundary_test_uncached(value):
                    flags.update(names)
            if len(flags) == before:
                break

    # ---------------------------------------------------------------- classification

    def is_boundary_test(self, expr: ast.AST) -> bool:
        """Does ``expr`` (an ``if`` test) decide "this micro-step is the boundary"?"""
        self._ensure_boundary_flags()
        return bool(self._cached("boundary", expr, lambda: self._boundary_test_uncached(expr)))

    def _boundary_test_uncached(self, expr: ast.AST) -> bool:
        if has_mod(expr) or self.counter_bound(expr) is not None or self._last_of_range(expr) \
                or self._window_start(expr):
            return True
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name | ast.Attribute):
            # a function of the file whose one return is a modulo test: `self.window_done(i)`
            name = expr.func.id if isinstance(expr.func, ast.Name) else expr.func.attr
            defs = self.defs_by_name().get(name, [])
            rets = [r.value for r in walk_local(defs[0]) if isinstance(r, ast.Return)] \
                if len(defs) == 1 else []
            if len(rets) == 1 and rets[0] is not None and has_mod(rets[0]):
                return True
        for sub in walk_all(expr):
            if isinstance(sub, ast.Name | ast.Attribute):
                d = dotted(sub)
                if d and d in self.boundary_flags:
                    return True
                ident = (sub.id if isinstance(sub, ast.Name) else sub.attr).lower()
                if BOUNDARY_RE.search(ident) or ACCUM_RE.search(ident):
                    return True
            elif isinstance(sub, ast.Call) and call_attr(sub) == "len":
                # `i == len(loader) - 1`: the last batch, i.e. a boundary
                parent = self.parents.get(sub)
                if isinstance(parent, ast.BinOp | ast.Compare):
                    return True
        return False

    def _window_start(self, expr: ast.AST) -> bool:
        """``c == 0`` (or ``not c``) for a counter the file counts up (``c += 1``) and resets
        (``c = 0``): the first micro-step of a window, right after the boundary (an
        optimizer wrapper's ``zero_grad`` that clears only when nothing is pending)."""
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            counter = dotted(expr.operand)
        elif isinstance(expr, ast.Compare) and len(expr.ops) == 1 \
                and isinstance(expr.ops[0], ast.Eq) and isinstance(expr.comparators[0], ast.Constant) \
                and expr.comparators[0].value == 0 and not isinstance(expr.comparators[0].value, bool):
            counter = dotted(expr.left)
        else:
            return False
        if counter is None:
            return False
        counted, reset = self._cached("window_start_counters", self.tree, self._counted_and_reset)
        return counter in counted and counter in reset

    def _counted_and_reset(self) -> tuple[set[str], set[str]]:
        """The names the file counts up (``c += ...``) and the names it sets to 0 (one walk
        per file: every ``c == 0`` test asks)."""
        counted: set[str] = set()
        reset: set[str] = set()
        for a in walk_all(self.tree):
            if isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add):
                if (d := dotted(a.target)) is not None:
                    counted.add(d)
            elif isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant) and a.value.value == 0:
                reset.update(d for t in a.targets if (d := dotted(t)) is not None)
        return counted, reset

    def _last_of_range(self, expr: ast.AST) -> bool:
        """``k == n - 1`` (or ``k + 1 == n``) inside ``for k in range(n)``: the last iteration
        of the loop that counts ``k``, whatever the names."""
        if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq)):
            return False
        for var, bound in ((expr.left, expr.comparators[0]), (expr.comparators[0], expr.left)):
            if isinstance(bound, ast.BinOp) and isinstance(bound.op, ast.Sub) \
                    and isinstance(bound.right, ast.Constant) and bound.right.value == 1:
                name, limit = var, bound.left
            elif isinstance(var, ast.BinOp) and isinstance(var.op, ast.Add) \
                    and isinstance(var.right, ast.Constant) and var.right.value == 1:
                name, limit = var.left, bound
            else:
                continue
            if not isinstance(name, ast.Name):
                continue
            loop = self.parents.get(expr)
            while loop is not None and not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
                                            and loop.target.id == name.id):
                loop = self.parents.get(loop)
            if loop is None or not (isinstance(loop.iter, ast.Call) and dotted(loop.iter.func) == "range"):
                continue
            args = loop.iter.args
            if (len(args) == 1 or (len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == 0)) \
                    and ast.dump(args[-1]) == ast.dump(limit):
                return True
        return False

    def counter_bound(self, test: ast.AST) -> ast.AST | None:
        """X of an ``if c == X:`` (or ``c >= X``) test whose body resets the counter (``c = 0``)
        while the loop around it counts ``c += 1``: a window of X micro-batches spelled with a
        counter instead of a modulo, whatever the names (``seen == n``)."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq | ast.GtE)):
            return None
        counter = dotted(test.left)
        bound = test.comparators[0]
        if counter is None or (isinstance(bound, ast.Constant)
                               and not (isinstance(bound.value, int) and bound.value > 1)):
            return None
        node = self.parents.get(test)
        if not isinstance(node, ast.If) or node.test is not test:
            return None
        resets = any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant) and a.value.value == 0
                     and any(dotted(t) == counter for t in a.targets)
                     for stmt in node.body for a in walk_all(stmt))
        loop = self.parents.get(node)
        while loop is not None and not isinstance(loop, ast.For | ast.AsyncFor | ast.While):
            loop = self.parents.get(loop)
        counts = loop is not None and any(
            isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add) and dotted(a.target) == counter
            and isinstance(a.value, ast.Constant) and a.value.value == 1 for a in walk_all(loop))
        return bound if resets and counts else None

    def boundary_polarity(self, expr: ast.AST) -> bool | None:
        """True when ``expr`` is truthy exactly at the boundary (``(i+1) % K == 0``,
        ``is_last``), False when it is truthy exactly off the boundary (``not is_last``,
        ``i % K != K - 1``, ``micro < K - 1``), None when it cannot be told."""
        self._ensure_boundary_flags()
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            inner = self.boundary_polarity(expr.operand)
            return None if inner is None else not inner
        if isinstance(expr, ast.BoolOp):
            pols = {self.boundary_polarity(v) for v in expr.values} - {None}
            return pols.pop() if len(pols) == 1 else None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            # `(i + 1) % K` is truthy off the boundary; `i % K` is truthy off the *first* step
            return False if _last_offset(expr.left) else None
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
            op = expr.ops[0]
            sides = (expr.left, expr.comparators[0])
            if not self._boundary_test_uncached(expr):
                return None
            # `(i + 1) % K == 0`, `i % K == K - 1`, `micro == K - 1`, `i + 1 == len(loader)` name
            # the last micro-step; `i % K == 0` or `micro == 0` the first one: no polarity then
            if not any(_last_offset(x) for x in sides):
                return None
            if isinstance(op, ast.Eq | ast.GtE | ast.Gt):
                return not isinstance(op, ast.Gt) or not any(has_mod(x) for x in sides)
            if isinstance(op, ast.NotEq | ast.Lt | ast.LtE):
                return False
            return None
        if isinstance(expr, ast.Name | ast.Attribute | ast.Call):
            target = expr.func if isinstance(expr, ast.Call) else expr
            d = dotted(target)
            ident = last_part(d)
            if isinstance(expr, ast.Call) and (body := self.predicates().get(ident)) is not None:
                # `self.is_sync_step(step)` with `def is_sync_step(...): return (step + 1) % K == 0`
                return self.boundary_polarity(body)
            if ident and d in self.boundary_flags and ACCUM_RE.search(ident):
                # `is_accumulating = (i + 1) % K != 0`: a flag named after accumulation is read
                # from its test, never taken as a boundary by its name
                src = self._flag_source(d)
                if isinstance(src, ast.Compare | ast.BoolOp | ast.UnaryOp):
                    return self.boundary_polarity(src)
                return None
            if ident and (POSITIVE_BOUNDARY_RE.search(ident) or d in self.boundary_flags):
                if d in self.boundary_flags:
                    src = self._flag_source(d)
                    if src is not None:
                        return self.boundary_polarity(src)
                return True
        return None

    def predicates(self) -> dict[str, ast.AST]:
        """Functions of the file whose body is one ``return <expr>`` (boundary helpers such as
        ``def is_sync_step(self, i): return (i + 1) % self.k == 0``), by lower-cased name; a
        name defined twice with different bodies is left out."""
        def compute() -> dict[str, ast.AST]:
            out: dict[str, ast.AST] = {}
            clash: set[str] = set()
            for fn in self.of(ast.FunctionDef):
                body = [b for b in fn.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
                if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                    name = fn.name.lower()
                    if name in out:
                        clash.add(name)
                    out[name] = body[0].value
            for name in clash:
                del out[name]
            return out
        return self._cached("predicates", self.tree, compute)  # type: ignore[no-any-return]

    def _flag_source(self, name: str) -> ast.AST | None:
        """The value of the first ``name = value`` of the file with that single target."""
        def compute() -> dict[str, ast.AST]:
            out: dict[str, ast.AST] = {}
            for names, value in self._assigns:
                if len(names) == 1:
                    out.setdefault(names[0], value)
            return out
        first: dict[str, ast.AST] = self._cached("flag_sources", self.tree, compute)
        return first.get(name)

    def in_accelerate_accumulate(self, node: ast.AST, window: ast.AST) -> bool:
        """True when ``node`` is under ``with <x>.accumulate(...)`` (or the window holds one)."""
        cur: ast.AST | None = node
        while cur is not None and not isinstance(cur, ast.Module):
            if isinstance(cur, ast.With | ast.AsyncWith) and any(
                _is_accumulate_call(item.context_expr) or _accumulation_manager(item.context_expr)
                for item in cur.items
            ):
                return True
            cur = self.parents.get(cur)
        own = self._instances()  # `learner.accumulate(batch)`: a method of the file's class
        return any((_is_accumulate_call(sub) and _receiver_name(sub) not in own) or (
            isinstance(sub, ast.With | ast.AsyncWith)
            and any(_accumulation_manager(item.context_expr) for item in sub.items))
            for sub in self.local_nodes(window))

    def unprepared_optimizer(self, name: str | None) -> bool:
        """``name`` (the optimizer a step steps) is a plain name the file assigns a
        ``torch.optim`` optimizer only (every assignment a constructor call), and no
        ``prepare(...)`` / ``prepare_optimizer(...)`` call of the file is given it or returns
        it: Accelerate never wrapped it, so it steps whenever called."""
        if not name:
            return False
        if "." in name:
            return self._unprepared_attribute(name)
        values = self.values_by_name().get(name, [])
        if not values or not all(
                isinstance(v, ast.Call) and re.match(r"(torch\.)?optim\.[A-Z]", dotted(v.func) or "")
                for v in values):
            return False
        return name not in self._prepared_names()

    def _unprepared_attribute(self, name: str) -> bool:
        """``self.optimizer`` (a dotted name) is only ever assigned ``torch.optim``
        constructor calls (each target of a tuple assignment paired with its own value): the
        object ``prepare()`` returned never replaced it, even when it was given to
        ``prepare`` (``opt = acc.prepare(self.optimizer)`` leaves the attribute raw)."""
        values: list[ast.AST] = []
        for node in self.of(ast.Assign):
            for tgt in node.targets:
                if isinstance(tgt, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(tgt.elts) == len(node.value.elts):
                    values += [v for t, v in zip(tgt.elts, node.value.elts, strict=True)
                               if dotted(t) == name]
                elif any(dotted(t) == name for t in ast.walk(tgt)):
                    values.append(node.value)
        return bool(values) and all(
            isinstance(v, ast.Call) and re.match(r"(torch\.)?optim\.[A-Z]", dotted(v.func) or "")
            for v in values)

    def _prepared_names(self) -> set[str]:
        """Every dotted name a ``prepare(...)`` / ``prepare_optimizer(...)`` call of the file
        is given or assigns (one pass, cached)."""
        def compute() -> set[str]:
            out: set[str] = set()
            for call in self.of(ast.Call):
                if call_attr(call) not in ("prepare", "prepare_optimizer"):
                    continue
                out.update(d for a in ast.walk(call) if (d := dotted(a)))
                parent = self.parents.get(call)
                if isinstance(parent, ast.Assign):
                    out.update(d for tgt in parent.targets for t in ast.walk(tgt) if (d := dotted(t)))
            return out
        return self._cached("prepared_names", self.tree, compute)  # type: ignore[no-any-return]

    def guarded(self, node: ast.AST, window: ast.AST) -> bool:
        """Is ``node`` only reached at an accumulation boundary (within ``window``)?"""
        child = node
        cur = self.parents.get(node)
        tested: list[str] = []  # names an `if` above tests: a helper's parameter, maybe
        while cur is not None:
            if isinstance(cur, ast.If | ast.IfExp) and child is not cur.test and self.is_boundary_test(cur.test):
                return True
            if isinstance(cur, ast.If) and child is not cur.test and isinstance(cur.test, ast.Name):
                tested.append(cur.test.id)
            if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef) and tested:
                site = self.inlined(window).get(cur)
                if site is not None and any(
                        (arg := bound_argument(cur, site, name)) is not None
                        and self.is_boundary_test(arg) for name in tested):
                    return True  # `loss_scaler(loss, opt, update_grad=(i + 1) % K == 0)`
            if isinstance(cur, ast.While) and cur is not window and self.is_boundary_test(cur.test):
                return True
            # an earlier `if <boundary>: continue` (or the else branch) in the same block
            for body_name in ("body", "orelse", "finalbody"):
                body = getattr(cur, body_name, None)
                if isinstance(body, list) and body:
                    where, stops = self._block_stops(cur, body_name, body)
                    i = where.get(id(child))
                    before = stops[:bisect_left(stops, i)] if i is not None else []
                    # the first such stop (as ever), and the nearest one above the call
                    if any(not (has_backward(body[stop + 1:i])
                                and not has_backward(body[stop:stop + 1]))
                           for stop in ({before[0], before[-1]} if before else ())):
                        # (a stop with no backward of its own, before the micro-step's
                        # backward, skips the whole micro-step: a fast-forward on resume,
                        # not a boundary; a later stop may still be the boundary)
                        return True
            if cur is window:
                return False
            child = cur
            cur = self.parents.get(cur)
        return False

    def _block_stops(self, owner: ast.AST, body_name: str,
                     body: list[ast.stmt]) -> tuple[dict[int, int], list[int]]:
        """For one block: each statement's index (by id), and the indices of its
        ``if <boundary>: continue``-like statements; computed once per block, not rescanned
        for every call asked about (a module's body is the whole file)."""
        def compute() -> tuple[dict[int, int], list[int]]:
            where: dict[int, int] = {}
            for i, stmt in enumerate(body):
                where.setdefault(id(stmt), i)
            stops = [
                i for i, prev in enumerate(body)
                if isinstance(prev, ast.If)
                and (_skips(owner, prev.body) or _skips(owner, prev.orelse))
                and self.is_boundary_test(prev.test)
            ]
            return where, stops
        return self._cached("stops:" + body_name, owner, compute)  # type: ignore[no-any-return]


def bound_argument(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call,
                    param: str) -> ast.AST | None:
    """The argument ``call`` gives ``fn``'s parameter ``param`` (``self`` skipped for a
    method called on an object), or None."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            return None
        if i < len(params) and params[i] == param:
            return a
    return None


def _last_offset(expr: ast.AST) -> bool:
    """``x + 1``, ``K - 1`` or ``len(...)`` in ``expr``: the comparison is about the *last*
    micro-step of a window (a counter from 0 compared with K needs the offset)."""
    for sub in walk_all(expr):
        if (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Add | ast.Sub)
            and isinstance(sub.right, ast.Constant)
            and sub.right.value == 1
        ):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "len":
            return True
    return False



def _accumulation_manager(node: ast.AST) -> bool:
    """A context manager whose name says accumulation (``with grad_accumulation(acc, model):``):
    a wrapper of ``accelerator.accumulate`` (or the like) defined out of sight."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else \
        node.func.id if isinstance(node.func, ast.Name) else ""
    return "accum" in name.lower()


def _receiver_name(node: ast.AST) -> str:
    """``x.y`` of a call ``x.y.name(...)``; "" for anything else."""
    func = getattr(node, "func", None)
    return (dotted(func.value) or "") if isinstance(func, ast.Attribute) else ""


def _is_accumulate_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "accumulate"


def _skips(owner: ast.AST, body: list[ast.stmt]) -> bool:
    """The block skips the rest of ``owner``'s block for this iteration or call (``continue``;
    ``return`` in a function), so what follows runs only when its ``if`` was false. A
    ``break`` (or a ``return`` inside a loop) ends the whole loop instead: what follows it
    runs on every micro-step before the end (``if it >= steps * K: break`` is a run limit,
    not a boundary)."""
    if not terminates(body) or isinstance(body[-1], ast.Break):
        return False
    return not (isinstance(body[-1], ast.Return)
                and isinstance(owner, ast.For | ast.AsyncFor | ast.While))



