"""What every lint rule needs to know about one file, computed once.

:class:`FileContext` walks the tree once (the parent map and the nodes by type),
then answers the questions the rules ask — "which loops are accumulation
windows?", "is this call only reached at the boundary?", "what is this
object?", "which DeepSpeed config does the script use?" — caching each answer
per node or scope so that the whole analysis stays linear in the file size
(a 5 MB script is linted in seconds). Rules never walk the whole tree on their
own; they ask the context. (Why ~750 lines in one module: the facts depend on each
other — windows on receivers, guards on boundary flags, accumulation on both — and
share one cache; the DeepSpeed config discovery, which depends on nothing else, lives
in :mod:`._dsrefs`.)

How "inside the accumulation window" is decided (docs/rules.md has the user's
version):

1. A *window* is the innermost loop whose body (not counting nested function or
   class definitions) calls ``.backward(`` (``loss.backward()``,
   ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
   ``engine.backward(loss)``, ``self.manual_backward(loss)``). A function named
   ``training_step``/``train_step`` that calls backward outside any loop is a
   window too: the framework calls it once per micro-batch.
2. A window is an *accumulation* window only when the code shows accumulation:
   an accumulation-like name, a modulo in an ``if`` that gates a step,
   ``no_sync`` or ``accelerator.accumulate`` — in the window, its function, its
   class (or the module, for top-level loops); for a DeepSpeed engine, a config
   in sight with GA > 1. Names inside an inner loop that only sums losses before
   one backward do not count: that loop is K = 1.
3. A call is *guarded* when an enclosing ``if`` (up to the window) tests a
   boundary, or an earlier ``if <boundary>: continue`` skips it; calls inside
   ``accelerator.accumulate(...)`` are gated by Accelerate.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accumguard.static.findings import RULES, Finding
from accumguard.static.lint._ast import (
    ACCUM_RE,
    BOUNDARY_RE,
    CLIP_FUNCS,
    DDP_WRAPPERS,
    ENGINE_RE,
    FRAMEWORK_BACKWARD,
    FUNCS,
    LOOPS,
    OPTIM_RE,
    OPTIMIZER_CLASSES,
    POSITIVE_BOUNDARY_RE,
    SCALER_RE,
    SCHED_RE,
    SCOPES,
    UNSCALE_FUNCS,
    WINDOW_FUNCS,
    WORLD_RE,
    call_attr,
    dotted,
    has_mod,
    identifiers,
    is_backward,
    last_part,
    local_identifiers,
    receiver,
    terminates,
    walk_all,
    walk_local,
)
from accumguard.static.lint._dsrefs import DsConfigFinder, DsConfigRef

#: a loop over these iterates the micro-batches of one window
_MICRO_ITER_RE = re.compile(r"window(?!s)|micro|chunk|accum")  # string literals naming a .json file we try to open


@dataclass
class WindowFacts:
    """The calls of one window that the rules reason about, classified once."""

    window: ast.AST
    steps: list[tuple[ast.Call, str]] = field(default_factory=list)  # (call, kind)
    zero_grads: list[tuple[ast.Call, str]] = field(default_factory=list)  # kind: optimizer|model
    clips: list[ast.Call] = field(default_factory=list)
    engine_backward: bool = False
    accumulating: bool = False
    accelerate: bool = False
    summed_loss: bool = False
    #: optimizer steps that run on every micro-step (AG101): the root cause that
    #: explains the zero_grad/scheduler/clip next to them, which are then not reported
    unguarded_optimizer_steps: list[ast.Call] = field(default_factory=list)
    engine_steps_unguarded: bool = False


class FileContext:
    """Facts about one parsed file, each computed on first use and cached."""

    def __init__(self, tree: ast.Module, path: Path | None) -> None:
        self.tree = tree
        self.path = path
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes: dict[type, list[ast.AST]] = {}
        wanted = (
            ast.Call, ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
            ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.With, ast.AsyncWith,
            ast.Import, ast.ImportFrom, ast.Dict, ast.Constant, ast.BinOp, ast.ClassDef,
        )
        parents = self.parents
        nodes = self.nodes
        wanted_set = set(wanted)
        AST = ast.AST
        skip = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)  # leaf singletons
        stack: list[ast.AST] = [tree]
        pop, push = stack.pop, stack.append
        while stack:  # one traversal, inlined: this loop dominates the cost of big files
            node = pop()
            t = type(node)
            if t in wanted_set:
                nodes.setdefault(t, []).append(node)
            for name in node._fields:
                v = getattr(node, name, None)
                if isinstance(v, list):
                    for item in v:
                        if isinstance(item, AST) and not isinstance(item, skip):
                            parents[item] = node
                            push(item)
                elif isinstance(v, AST) and not isinstance(v, skip):
                    parents[v] = node
                    push(v)
        for lst in nodes.values():  # source order, as ast.walk's callers expect
            lst.sort(key=_pos)
        self.optimizers: set[str] = set()
        self.schedulers: set[str] = set()
        self.engines: set[str] = set()
        self.deepspeed = False
        self.ddp_wrapped = False
        self.explicit_ds_boundary = False
        self.boundary_flags: set[str] = set()
        self._assigns: list[tuple[list[str], ast.AST]] = []
        self._flags_ready = False
        self._cache: dict[tuple[str, int], Any] = {}
        self._collect_facts()
        self.ds_backward_receivers = self._collect_ds_backward_receivers()

    # ---------------------------------------------------------------- nodes and findings

    def of(self, *types: type) -> list[Any]:
        """Nodes of the given types, in walk order per type."""
        out: list[ast.AST] = []
        for t in types:
            out.extend(self.nodes.get(t, ()))
        return out

    def finding(self, code: str, node: ast.AST, message: str, fix: str | None = None) -> Finding:
        """A script finding at ``node`` with the rule's severity, confidence and fix."""
        rule = RULES[code]
        return Finding(
            code=code,
            severity=rule.severity,
            message=message,
            fix=fix or rule.fix,
            line=getattr(node, "lineno", 1),
            col=getattr(node, "col_offset", 0) + 1,
            end_line=getattr(node, "end_lineno", None),
            end_col=(getattr(node, "end_col_offset", None) or 0) + 1,
            confidence=rule.confidence,
        )

    def _cached(self, kind: str, node: ast.AST, compute: Any) -> Any:
        key = (kind, id(node))
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def local_nodes(self, node: ast.AST) -> list[ast.AST]:
        """``walk_local(node)`` as a list, cached (windows and functions are walked by several rules)."""
        return self._cached("local", node, lambda: list(walk_local(node)))  # type: ignore[no-any-return]

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, kinds):
            cur = self.parents.get(cur)
        return cur

    def assignments(self) -> list[tuple[list[str], ast.AST]]:
        """Every ``names = value`` of the file (targets as dotted names), in source order."""
        return self._assigns

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function around ``node``, or the module."""
        return self.enclosing(node, FUNCS) or self.tree

    # ---------------------------------------------------------------- facts

    def _collect_facts(self) -> None:
        assigns: list[tuple[list[str], ast.AST]] = []
        for node in self.of(ast.Import, ast.ImportFrom, ast.Call, ast.Assign, ast.AnnAssign, ast.NamedExpr):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module:
                    mods.append(node.module)
                if any(m.split(".")[0] == "deepspeed" for m in mods):
                    self.deepspeed = True
            elif isinstance(node, ast.Call):
                name = call_attr(node) or ""
                if name in DDP_WRAPPERS:
                    self.ddp_wrapped = True
                if name in ("coalesce_grad_reduction", "set_gradient_accumulation_boundary", "no_sync"):
                    self.explicit_ds_boundary = True
            else:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if value is None:
                    continue
                names: list[str] = []
                for t in targets:
                    if isinstance(t, ast.Tuple | ast.List):
                        names.extend(d for d in (dotted(e) for e in t.elts) if d)
                        self._classify_unpack(t, value)
                    elif (d := dotted(t)) is not None:
                        names.append(d)
                        self._classify_assign(d, value)
                assigns.append((names, value))
        self._assigns = assigns

    def _classify_assign(self, target: str, value: ast.AST) -> None:
        if not isinstance(value, ast.Call):
            return
        callee = dotted(value.func) or ""
        last = last_part(callee)
        if last in OPTIMIZER_CLASSES or ("optim" in callee.lower() and "sched" not in callee.lower()):
            if "lr_scheduler" in callee or "sched" in last:
                self.schedulers.add(target)
            else:
                self.optimizers.add(target)
        elif "sched" in callee.lower() or re.search(
            r"schedule|^(step|multistep|exponential|cosine|onecycle|lambda|linear)lr", last
        ):
            self.schedulers.add(target)
        elif callee.startswith("deepspeed.") and last == "initialize":
            self.engines.add(target)

    def _classify_unpack(self, target: ast.Tuple | ast.List, value: ast.AST) -> None:
        if isinstance(value, ast.Call) and last_part(dotted(value.func)) == "initialize":
            callee = dotted(value.func) or ""
            if "deepspeed" in callee or self.deepspeed:
                elts = target.elts
                if elts and (d := dotted(elts[0])):
                    self.engines.add(d)
                if len(elts) > 1 and (d := dotted(elts[1])):
                    self.optimizers.add(d)
                if len(elts) > 3 and (d := dotted(elts[3])):
                    self.schedulers.add(d)

    def _collect_ds_backward_receivers(self) -> set[str]:
        out: set[str] = set()
        if not self.deepspeed:
            return out
        for n in self.of(ast.Call):
            if is_backward(n) and n.args:
                name = dotted(receiver(n))
                if name and last_part(name) not in FRAMEWORK_BACKWARD and "scale" not in name:
                    out.add(name)
        return out

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
        if has_mod(expr):
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
            if ident and (POSITIVE_BOUNDARY_RE.search(ident) or (d in self.boundary_flags and not ACCUM_RE.search(ident))):
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
        for names, value in self._assigns:
            if names == [name]:
                return value
        return None

    def kind_of_receiver(self, recv: ast.AST | None) -> str:
        """'engine' | 'scheduler' | 'optimizer' | 'scaler' | 'other' for the object a method is called on."""
        name = dotted(recv)
        if name is None:
            # e.g. self.optimizers()[0].step() or opts[i].step()
            if isinstance(recv, ast.Subscript):
                return self.kind_of_receiver(recv.value)
            return "other"
        last = last_part(name)
        if name in self.engines or ENGINE_RE.search(last):
            return "engine"
        if name in self.schedulers or SCHED_RE.search(last):
            return "scheduler"
        if name in self.optimizers or OPTIM_RE.search(last):
            return "optimizer"
        if SCALER_RE.search(last):
            return "scaler"
        if self.deepspeed and name in self.ds_backward_receivers:
            return "engine"
        return "other"

    # ---------------------------------------------------------------- windows

    def windows(self) -> list[ast.AST]:
        """Innermost loops (and window functions) above each backward call."""
        return self._cached("windows", self.tree, self._windows_uncached)  # type: ignore[no-any-return]

    def _windows_uncached(self) -> list[ast.AST]:
        out: list[ast.AST] = []
        seen: set[ast.AST] = set()
        for call in self.of(ast.Call):
            if not is_backward(call):
                continue
            cur = self.parents.get(call)
            while cur is not None and not isinstance(cur, LOOPS + SCOPES):
                cur = self.parents.get(cur)
            if isinstance(cur, FUNCS) and not (
                cur.name in WINDOW_FUNCS or cur.name.startswith("training_step")
            ):
                continue
            if cur is None or isinstance(cur, ast.ClassDef | ast.Lambda) or cur in seen:
                continue
            seen.add(cur)
            out.append(cur)
        # a loop that contains a window loop is not itself a window (nanoGPT: outer loop steps)
        not_innermost: set[ast.AST] = set()
        for w in out:
            if not isinstance(w, LOOPS):
                continue
            cur = self.parents.get(w)
            while cur is not None and not isinstance(cur, SCOPES):
                if cur in seen:
                    not_innermost.add(cur)
                cur = self.parents.get(cur)
        out = [w for w in out if w not in not_innermost]
        out.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        return out

    def _inner_summing_loops(self, window: ast.AST) -> list[ast.AST]:
        """Loops inside ``window`` without a backward that build the loss (``loss += ...``):
        the micro-batches of such a loop are summed into one graph, one backward: K = 1."""
        out: list[ast.AST] = []
        fed: set[str] = set()  # names the window's backward calls are built from
        for n in self.local_nodes(window):
            if isinstance(n, ast.Call) and is_backward(n):
                for part in (receiver(n), *n.args[:1]):
                    if part is not None:
                        fed.update(d for d in (dotted(x) for x in walk_all(part)) if d)
        for sub in self.local_nodes(window):
            if sub is window or not isinstance(sub, LOOPS):
                continue
            if any(isinstance(n, ast.Call) and is_backward(n) for n in walk_local(sub)):
                continue
            for n in walk_local(sub):
                tgt: ast.AST | None = None
                if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add):
                    tgt = n.target
                elif isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Add):
                    tgt = n.targets[0]
                elif isinstance(n, ast.Call) and call_attr(n) == "append":
                    tgt = receiver(n)
                if tgt is not None and (dotted(tgt) in fed or any("loss" in i for i in identifiers(tgt))):
                    out.append(sub)
                    break
        return out

    def _scope_shows_accumulation(self, node: ast.AST, skip: frozenset[ast.AST] = frozenset()) -> bool:
        def compute() -> bool:
            for sub in self.local_nodes(node):
                if sub in skip:
                    continue
                # a modulo that gates a step (not `if i % 100 == 0: print(...)`)
                if isinstance(sub, ast.If) and has_mod(sub.test) and self._gates_step(sub):
                    return True
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in ("no_sync", "accumulate", "no_backward_sync")
                    and dotted(sub.func.value) != "itertools"
                ):
                    return True
            idents = self.identifier_set(node)
            if skip:
                idents = idents.difference(*(self.identifier_set(s) for s in skip))
            # bare `accumulate` is itertools.accumulate / index_put_(accumulate=True)
            return any(_accum_name(i) for i in idents)

        if skip:
            return compute()
        return bool(self._cached("scope_accum", node, compute))

    def identifier_set(self, node: ast.AST) -> set[str]:
        """The distinct lower-cased identifiers of ``node`` outside nested scopes (cached)."""
        return self._cached("idents", node, lambda: set(local_identifiers(node)))  # type: ignore[no-any-return]

    @staticmethod
    def _gates_step(node: ast.If) -> bool:
        """The ``if`` decides when a step (or zero_grad) happens on gradients accumulated
        outside it. A branch that computes its own gradient first (``zero_grad(); loss.backward();
        opt.step()``: WGAN's generator every n_critic batches, RL's train_freq) is a periodic
        update, not an accumulation boundary."""
        for branch in (node.body, node.orelse):
            calls = sorted((s for stmt in branch for s in walk_local(stmt) if isinstance(s, ast.Call)), key=_pos)
            first_backward = next((i for i, c in enumerate(calls) if is_backward(c)), None)
            for i, c in enumerate(calls):
                name = call_attr(c)
                if name == "step" and (first_backward is None or i < first_backward):
                    return True
                if name == "zero_grad" and first_backward is None:
                    return True
        return terminates(node.body)

    def shows_accumulation(self, window: ast.AST, skip: frozenset[ast.AST] = frozenset()) -> bool:
        """Does the code around ``window`` show gradient accumulation (see module doc)?"""
        if self._scope_shows_accumulation(window, skip):
            return True
        fn = window if isinstance(window, FUNCS) else self.enclosing(window, FUNCS)
        if fn is None:
            return self._scope_shows_accumulation(self.tree, skip)
        if self._scope_shows_accumulation(fn, skip):
            return True
        cls = self.enclosing(fn, (ast.ClassDef,))
        if cls is not None:
            # the class's own settings (class attributes, `self.x = ...` in __init__), not every
            # identifier of a big class (a test class mentions accumulation in other methods)
            return bool(self._cached(
                "class_accum", cls, lambda: _class_settings_accumulate(cls)  # type: ignore[arg-type]
            ))
        return False

    def in_accelerate_accumulate(self, node: ast.AST, window: ast.AST) -> bool:
        """True when ``node`` is under ``with <x>.accumulate(...)`` (or the window holds one)."""
        cur: ast.AST | None = node
        while cur is not None and not isinstance(cur, ast.Module):
            if isinstance(cur, ast.With | ast.AsyncWith) and any(
                _is_accumulate_call(item.context_expr) for item in cur.items
            ):
                return True
            cur = self.parents.get(cur)
        return any(_is_accumulate_call(sub) for sub in self.local_nodes(window))

    def guarded(self, node: ast.AST, window: ast.AST) -> bool:
        """Is ``node`` only reached at an accumulation boundary (within ``window``)?"""
        child = node
        cur = self.parents.get(node)
        while cur is not None:
            if isinstance(cur, ast.If | ast.IfExp) and child is not cur.test and self.is_boundary_test(cur.test):
                return True
            if isinstance(cur, ast.While) and cur is not window and self.is_boundary_test(cur.test):
                return True
            # an earlier `if <boundary>: continue` (or the else branch) in the same block
            for body_name in ("body", "orelse", "finalbody"):
                body = getattr(cur, body_name, None)
                if isinstance(body, list) and child in body:
                    for prev in body[: body.index(child)]:
                        if (
                            isinstance(prev, ast.If)
                            and (terminates(prev.body) or terminates(prev.orelse))
                            and self.is_boundary_test(prev.test)
                        ):
                            return True
            if cur is window:
                return False
            child = cur
            cur = self.parents.get(cur)
        return False

    def window_facts(self, window: ast.AST) -> WindowFacts:
        """The classified calls of ``window`` and whether it accumulates (cached)."""
        return self._cached("facts", window, lambda: self._window_facts(window))  # type: ignore[no-any-return]

    def _window_facts(self, window: ast.AST) -> WindowFacts:
        f = WindowFacts(window)
        calls = [n for n in self.local_nodes(window) if isinstance(n, ast.Call)]
        calls.sort(key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            attr = call_attr(call)
            recv = receiver(call)
            if attr == "step":
                kind = self.kind_of_receiver(recv)
                if kind == "scaler" and call.args:
                    kind = "optimizer"
                if kind in ("optimizer", "scheduler", "engine"):
                    f.steps.append((call, kind))
            elif attr == "zero_grad" and recv is not None:
                kind = self.kind_of_receiver(recv)
                if kind != "engine":
                    f.zero_grads.append((call, "optimizer" if kind == "optimizer" else "model"))
            elif attr in CLIP_FUNCS or (attr in UNSCALE_FUNCS and recv is not None):
                f.clips.append(call)
            elif is_backward(call) and self.kind_of_receiver(recv) == "engine" and call.args:
                f.engine_backward = True
        summing = self._inner_summing_loops(window)
        f.summed_loss = bool(summing)
        ds = self.ds_config() if f.engine_backward else None
        ds_ga = ds.ga if ds is not None else None
        f.accumulating = self.shows_accumulation(window, frozenset(summing)) or (
            ds_ga is not None and ds_ga > 1
        )
        iterates_micro_batches = isinstance(window, ast.For | ast.AsyncFor) and any(
            _MICRO_ITER_RE.search(i) for i in identifiers(window.iter)
        )
        if iterates_micro_batches:
            f.accumulating = True  # `for mb in window:` / `for micro in batch.chunk(K):`
        elif f.accumulating and not (ds_ga is not None and ds_ga > 1) and self._plain_k1_shape(window, f):
            f.accumulating = False
        f.accelerate = self.in_accelerate_accumulate(window, window)
        f.engine_steps_unguarded = any(
            k == "engine" and not self.guarded(c, window) for c, k in f.steps
        )
        if f.accumulating and not f.accelerate:
            f.unguarded_optimizer_steps = [
                c for c, k in f.steps if k == "optimizer" and not self.guarded(c, window)
            ]
        return f

    def is_window(self, node: ast.AST) -> bool:
        windows = self._cached("window_set", self.tree, lambda: set(self.windows()))
        return node in windows

    # ---------------------------------------------------------------- values by name

    def _derived_names(self, pattern: re.Pattern[str]) -> set[str]:
        """Names assigned (to a fixpoint) from an expression mentioning ``pattern``:
        ``size = float(dist.get_world_size())``, ``K = args.grad_accum_steps``."""
        def compute() -> set[str]:
            out: set[str] = set()
            for _ in range(3):
                before = len(out)
                for names, value in self._assigns:
                    v = _unwrap_alias(value)
                    if (
                        v is not None
                        and len(names) == 1
                        and names[0] not in out
                        and self._mentions(v, pattern, out)
                    ):
                        out.update(names)
                if len(out) == before:
                    break
            return out
        return self._cached("derived:" + pattern.pattern, self.tree, compute)  # type: ignore[no-any-return]

    @staticmethod
    def _mentions(expr: ast.AST, pattern: re.Pattern[str], names: set[str]) -> bool:
        for sub in walk_all(expr):
            if isinstance(sub, ast.Name | ast.Attribute):
                d = dotted(sub)
                if d is not None and d in names:
                    return True
                ident = sub.id if isinstance(sub, ast.Name) else sub.attr
                if pattern.search(ident.lower()):
                    return True
            elif (
                isinstance(sub, ast.Constant)
                and isinstance(sub.value, str)
                and len(sub.value) < 40
                and pattern.search(sub.value.lower())
            ):
                return True
        return False

    def int_value(self, expr: ast.AST | None, *, defaults: bool = True) -> int | None:
        """The integer ``expr`` holds, when the file says so in one way: a literal, a name whose
        every assignment is the same integer literal, or ``args.x`` / ``cfg.x`` whose argparse
        ``default=`` or class-field default is an integer (what the script runs with by default)."""
        if isinstance(expr, ast.Constant):
            return expr.value if type(expr.value) is int else None
        d = dotted(expr)
        if d is None:
            return None
        values = set(self._int_assignments().get(d, ()))
        if not values and "." in d and defaults:
            values = self._int_defaults().get(last_part(d), set())
        return next(iter(values)) if len(values) == 1 and None not in values else None

    def int_candidates(self, expr: ast.AST | None) -> set[int | None]:
        """Every integer the file gives ``expr`` (None for a computed value): its literal, each
        assignment to the name, and for ``args.x`` / ``cfg.x`` the argparse or field default."""
        if isinstance(expr, ast.Constant):
            return {expr.value if type(expr.value) is int else None}
        d = dotted(expr)
        if d is None:
            return {None}
        values = set(self._int_assignments().get(d, ()))
        if "." in d:
            values |= self._int_defaults().get(last_part(d), set())
        return values or {None}

    def _int_assignments(self) -> dict[str, set[int | None]]:
        """Every value assigned to each name: the integer literal, or None for anything else."""
        def compute() -> dict[str, set[int | None]]:
            out: dict[str, set[int | None]] = {}
            for names, value in self._assigns:
                if len(names) == 1:
                    v = value.value if isinstance(value, ast.Constant) and type(value.value) is int else None
                    out.setdefault(names[0], set()).add(v)
                else:
                    for name in names:
                        out.setdefault(name, set()).add(None)
            for n in self.of(ast.AugAssign):
                if (d := dotted(n.target)) is not None:
                    out.setdefault(d, set()).add(None)
            return out
        return self._cached("int_assigns", self.tree, compute)  # type: ignore[no-any-return]

    def _int_defaults(self) -> dict[str, set[int | None]]:
        """argparse ``add_argument("--grad-accum", default=4)`` and class fields
        ``gradient_accumulation_steps: int = 4``, by lower-cased attribute name."""
        def compute() -> dict[str, set[int | None]]:
            out: dict[str, set[int | None]] = {}
            for call in self.of(ast.Call):
                if call_attr(call) != "add_argument":
                    continue
                default = next((k.value for k in call.keywords if k.arg == "default"), None)
                dest = next((k.value.value for k in call.keywords
                             if k.arg == "dest" and isinstance(k.value, ast.Constant)), None)
                if dest is None:
                    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                    long = [f for f in flags if f.startswith("--")] or flags
                    dest = long[0].lstrip("-").replace("-", "_") if long else None
                if isinstance(dest, str) and default is not None:
                    v = default.value if isinstance(default, ast.Constant) and type(default.value) is int else None
                    out.setdefault(dest.lower(), set()).add(v)
            for cls in self.of(ast.ClassDef):
                for stmt in cls.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                        field_default = stmt.value
                        iv = (
                            field_default.value
                            if isinstance(field_default, ast.Constant) and type(field_default.value) is int
                            else None
                        )
                        out.setdefault(stmt.target.id.lower(), set()).add(iv)
            return out
        return self._cached("int_defaults", self.tree, compute)  # type: ignore[no-any-return]

    def mentions_world(self, expr: ast.AST) -> bool:
        """``expr`` is (or is built from) the world size."""
        return self._mentions(expr, WORLD_RE, self._derived_names(WORLD_RE))

    def mentions_accum(self, expr: ast.AST) -> bool:
        """``expr`` is (or is built from) the number of accumulation steps."""
        return self._mentions(expr, ACCUM_RE, self._derived_names(ACCUM_RE))

    def _plain_k1_shape(self, window: ast.AST, f: WindowFacts) -> bool:
        """backward, step and zero_grad all unguarded in the window, and nothing in the window
        itself says accumulation (the evidence was elsewhere in the function or file, e.g.
        ``micro_batch_size = 1`` or a reference loop over whole windows): one step per
        backward, nothing accumulated, K = 1."""
        if self._scope_shows_accumulation(window):
            return False
        if not any(k == "optimizer" and not self.guarded(c, window) for c, k in f.steps):
            return False
        return any(not self.guarded(z, window) for z, _ in f.zero_grads)

    # ---------------------------------------------------------------- script-level facts

    def is_training_script(self) -> bool:
        """A backward and an optimizer step in the same file: a training loop, not library code."""
        def compute() -> bool:
            calls = self.of(ast.Call)
            has_backward = any(is_backward(c) for c in calls)
            has_step = any(
                call_attr(c) == "step" and self.kind_of_receiver(receiver(c)) in ("optimizer", "scaler", "engine")
                for c in calls
            )
            return has_backward and has_step
        return bool(self._cached("training", self.tree, compute))

    def all_reduced_names(self, scope: ast.AST) -> set[str]:
        """Dotted names passed to an all-reduce in ``scope`` (counts, losses, gradients)."""
        def compute() -> set[str]:
            out: set[str] = set()
            for n in self.local_nodes(scope):
                if isinstance(n, ast.Call) and call_attr(n) in (
                    "all_reduce", "all_reduce_coalesced", "reduce", "gather", "all_gather",
                    "reduce_tensor", "sync_tensor",
                ) and n.args:
                    out.update(d for d in (dotted(s) for s in walk_all(n.args[0])) if d)
            return out
        return self._cached("allreduced", scope, compute)  # type: ignore[no-any-return]

    def backward_losses(self, scope: ast.AST) -> list[tuple[ast.Call, set[str]]]:
        """Each backward call in ``scope`` with the dotted names its loss is built from
        (``loss.backward()`` -> {loss}; ``scaler.scale(loss).backward()`` -> {loss, scaler};
        ``accelerator.backward(loss)`` -> {loss})."""
        def compute() -> list[tuple[ast.Call, set[str]]]:
            out = []
            for n in self.local_nodes(scope):
                if isinstance(n, ast.Call) and is_backward(n):
                    recv = receiver(n)
                    src: set[str] = set()
                    name = dotted(recv)
                    framework = name is not None and (
                        last_part(name) in FRAMEWORK_BACKWARD or self.kind_of_receiver(recv) == "engine"
                    )
                    if recv is not None and not framework:
                        src |= {d for d in (dotted(s) for s in walk_all(recv)) if d}
                    for a in n.args[:1]:
                        src |= {d for d in (dotted(s) for s in walk_all(a)) if d}
                    out.append((n, src))
            return out
        return self._cached("backward_losses", scope, compute)  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- DeepSpeed config

    def ds_config(self) -> DsConfigRef | None:
        """The DeepSpeed config the script names (a .json path literal or a dict literal)."""
        return self._ds_finder().ds_config()

    def ds_config_literals(self) -> list[DsConfigRef]:
        """Every dict literal (or ``dict(...)`` call) in the script that is a DeepSpeed config."""
        return self._ds_finder().ds_config_literals()

    def ds_finder(self) -> DsConfigFinder:
        """The file's DeepSpeed config finder (value expressions of a config's keys)."""
        return self._ds_finder()

    def _ds_finder(self) -> DsConfigFinder:
        return self._cached("ds_finder", self.tree, lambda: DsConfigFinder(self))  # type: ignore[no-any-return]


_ACCUM_NAMES: dict[str, bool] = {}


def _accum_name(ident: str) -> bool:
    """``ACCUM_RE`` on an identifier, memoised (a big file repeats the same few names)."""
    hit = _ACCUM_NAMES.get(ident)
    if hit is None:
        hit = ident != "accumulate" and ACCUM_RE.search(ident) is not None
        if len(_ACCUM_NAMES) < 100_000:
            _ACCUM_NAMES[ident] = hit
    return hit


def _class_settings_accumulate(cls: ast.ClassDef) -> bool:
    targets: list[ast.AST] = []
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets += stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            for sub in walk_all(stmt):
                if isinstance(sub, ast.Assign | ast.AnnAssign):
                    targets += sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                elif isinstance(sub, ast.arg):
                    targets.append(ast.Name(sub.arg))
    return any(ACCUM_RE.search(i) and i != "accumulate" for t in targets for i in identifiers(t))


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


def _unwrap_alias(value: ast.AST) -> ast.AST | None:
    """The aliased expression of ``float(dist.get_world_size())``, ``args.grad_accum``,
    ``len(micro_batches)`` or ``int(os.environ["WORLD_SIZE"])``; None for arithmetic or
    anything else (a name derived from W by a computation is not W)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in (
        "int", "float", "len"
    ) and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, ast.Name | ast.Attribute | ast.Subscript | ast.Call | ast.Constant):
        return value
    return None


def _pos(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _is_accumulate_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "accumulate"
