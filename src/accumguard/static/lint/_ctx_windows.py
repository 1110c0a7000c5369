"""Window questions of a lint file context: which loops are accumulation windows, and the
calls of each one classified once (rules 1 and 2 of :mod:`._context`)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accumguard.static.lint._ast import (
    ACCUM_RE,
    CLIP_FUNCS,
    FUNCS,
    LOOPS,
    SCOPES,
    UNSCALE_FUNCS,
    WINDOW_FUNCS,
    call_attr,
    checks_or_reports,
    dotted,
    has_mod,
    identifiers,
    is_backward,
    last_part,
    local_identifiers,
    own_identifier,
    position,
    receiver,
    terminates,
    walk_all,
    walk_local,
)
from accumguard.static.lint._ctx_batch import (
    MICRO_ITER_RE,
    accum_name,
    accum_only_builds_batch,
    assembles_window,
    iter_identifiers,
    steps_by_window,
    whole_window_iteration,
    yields_windows,
)
from accumguard.static.lint._ctx_file import _pos
from accumguard.static.lint._ctx_ownrate import OwnRateQueries, stepped_name

#: Levels of backward helpers followed up to the loop that runs them (a trainer's
#: ``train_epoch`` loop -> ``_training_step`` -> ``_backward``).
HELPER_DEPTH = 3


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
    #: optimizers (and the modules whose parameters they were built on) that step on every
    #: micro-step with their own zero_grad in the window while another optimizer steps at
    #: the boundary: a second optimizer at its own rate (a GAN's discriminator, a critic),
    #: not F1; their steps and zero_grads are not the accumulating window's
    own_rate: set[str] = field(default_factory=set)


class WindowQueries(OwnRateQueries):
    """Windows, whether they accumulate, and their classified calls."""

    if TYPE_CHECKING:  # :class:`._ctx_values.ValueFacts`' own, beside this in the context
        def mentions_accum(self, expr: ast.AST) -> bool: ...
        def sized_by_accum(self, expr: ast.AST, depth: int = 2) -> bool: ...
        def int_value(self, expr: ast.AST | None, *, defaults: bool = True) -> int | None: ...

    # ---------------------------------------------------------------- windows

    def windows(self) -> list[ast.AST]:
        """Innermost loops (and window functions) above each backward call."""
        return self._cached("windows", self.tree, self._windows_uncached)  # type: ignore[no-any-return]

    def _windows_uncached(self) -> list[ast.AST]:
        return self._windows_and_inlined()[0]

    def inlined(self, window: ast.AST) -> dict[ast.AST, ast.Call]:
        """The backward helpers ``window`` calls (helper function -> its call in the window):
        their calls count as the window's, one level deep."""
        return self._windows_and_inlined()[1].get(window, {})

    def _windows_and_inlined(self) -> tuple[list[ast.AST], dict[ast.AST, dict[ast.AST, ast.Call]]]:
        return self._cached("windows_inlined", self.tree, self._find_windows)  # type: ignore[no-any-return]

    def _find_windows(self) -> tuple[list[ast.AST], dict[ast.AST, dict[ast.AST, ast.Call]]]:
        out: list[ast.AST] = []
        seen: set[ast.AST] = set()
        helpers: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        for call in self.of(ast.Call):
            if not is_backward(call):
                continue
            cur = self.parents.get(call)
            while cur is not None and not isinstance(cur, LOOPS + SCOPES):
                cur = self.parents.get(cur)
            cur = self._over_named_objects(cur)
            if isinstance(cur, FUNCS) and not self._framework_step(cur):
                if cur not in helpers:
                    helpers.append(cur)  # a backward helper: its callers' loops are the windows
                continue
            if cur is None or isinstance(cur, ast.ClassDef | ast.Lambda) or cur in seen:
                continue
            seen.add(cur)
            out.append(cur)
        inlined: dict[ast.AST, dict[ast.AST, ast.Call]] = {}
        # a helper called only from another function (a trainer's `_training_step` calling
        # its `_backward`): that function is a helper too, up to HELPER_DEPTH levels; the
        # loops calling the outermost one are the windows, every level inlined into them
        below: dict[ast.AST, list[tuple[ast.AST, ast.Call]]] = {h: [] for h in helpers}
        depth = {h: 1 for h in helpers}
        i = 0
        while i < len(helpers):
            helper = helpers[i]
            i += 1
            for site in self._helper_call_sites(helper):
                loop = self.parents.get(site)
                while loop is not None and not isinstance(loop, LOOPS + SCOPES):
                    loop = self.parents.get(loop)
                if isinstance(loop, FUNCS) and loop not in below \
                        and depth[helper] < HELPER_DEPTH and not self._framework_step(loop):
                    helpers.append(loop)
                    depth[loop] = depth[helper] + 1
                    below[loop] = [(helper, site), *below[helper]]
                    continue
                if not isinstance(loop, LOOPS):
                    continue  # called once per function call: a window only when named like one
                links = inlined.setdefault(loop, {})
                links.setdefault(helper, site)
                for sub, sub_site in below[helper]:
                    links.setdefault(sub, sub_site)
                if loop not in seen:
                    seen.add(loop)
                    out.append(loop)
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
        return out, {w: m for w, m in inlined.items() if w in out}

    def _helper_call_sites(self, helper: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """Where ``helper`` is called: ``name(...)`` for a function (module-level or nested),
        ``self.name(...)`` inside its own class for a method, and where a function it is handed
        to calls it (``run_epoch(step_fn, loader)``: :meth:`passed_call_sites`). A name defined
        twice is not followed (which definition runs cannot be told)."""
        owner = self.parents.get(helper)
        defs, by_name, by_self = self._call_index()
        if defs.get(helper.name, 0) != 1:
            return []
        passed = self.passed_call_sites(helper)
        if isinstance(owner, ast.ClassDef) and helper.name == "__call__":
            names = {n for n, cls in self.callable_instances().items() if cls is owner}
            return [c for c in self.of(ast.Call)  # `loss_scaler(loss, optimizer, ...)`
                    if isinstance(c.func, ast.Name) and c.func.id in names] + passed
        if isinstance(owner, ast.ClassDef):
            instances = self._instances()
            # (an optimizer class of the file is a step, not a helper: SAM's `step(closure)`)
            held = [] if any(re.search(r"optimizer$", last_part(dotted(b))) for b in owner.bases) \
                else [c for c in self._instance_calls().get(helper.name, ())
                      if isinstance(c.func, ast.Attribute)
                      and self.inherits(instances.get(dotted(c.func.value) or ""), owner)]
            return [c for c in by_self.get(helper.name, ())
                    if self.inherits(self.enclosing(c, (ast.ClassDef,)), owner)] + held + passed
        return list(by_name.get(helper.name, ())) + passed + self._factory_call_sites(helper)

    def _factory_call_sites(self, helper: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
        """Calls of a closure its factory returns: ``def make_step(...): def micro(...):
        ...; return micro`` then ``step_fn = make_step(...)`` and ``step_fn(x)`` (a tuple
        return is matched by position: ``micro, step = make_trainer(...)``). Names bound
        once only."""
        factory = self.parents.get(helper)
        if not isinstance(factory, FUNCS):
            return []
        slots: set[int | None] = set()
        for ret in self.local_nodes(factory):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            if isinstance(ret.value, ast.Name) and ret.value.id == helper.name:
                slots.add(None)
            elif isinstance(ret.value, ast.Tuple):
                slots |= {i for i, e in enumerate(ret.value.elts)
                          if isinstance(e, ast.Name) and e.id == helper.name}
        if not slots:
            return []
        _, by_name, _ = self._call_index()
        bound: list[str] = []
        for call in by_name.get(factory.name, ()):
            stmt = self.parents.get(call)
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target = stmt.targets[0]
            if None in slots and isinstance(target, ast.Name):
                bound.append(target.id)
            elif isinstance(target, ast.Tuple):
                bound += [e.id for i, e in enumerate(target.elts)
                          if i in slots and isinstance(e, ast.Name)]
        names = {b for b in bound if bound.count(b) == 1 and b != helper.name}
        return [c for b in names for c in by_name.get(b, ())]

    def via_text(self, node: ast.AST, window: ast.AST) -> str:
        """`` (in `_apply()`, run from line 21)`` for a call that sits in a helper the window
        runs (the line of the window's own call that leads to it), else ``""``."""
        links = {**self.reached(window), **self.inlined(window)}
        fn = self.enclosing(node, FUNCS)
        if fn is None or fn not in links:
            return ""
        site, seen = links[fn], {fn}
        while (up := self.enclosing(site, FUNCS)) in links and up not in seen:
            seen.add(up)
            site = links[up]
        return f" (in `{getattr(fn, 'name', '?')}()`, run from line {site.lineno})"

    def reached(self, window: ast.AST) -> dict[ast.AST, ast.Call]:
        """The functions without a backward that ``window`` (or a backward helper of it) runs
        on every micro-step, helpers calling helpers included, each with the call that runs it
        (:meth:`reach_from`, cached): their steps, clears and clips are the window's."""
        return self._cached(  # type: ignore[no-any-return]
            "reached", window, lambda: self.reach_from((window, *self.inlined(window))))

    def _over_named_objects(self, loop: ast.AST | None) -> ast.AST | None:
        """``loop``, or for ``for opt in (opt_enc, opt_head):`` (a literal tuple of names:
        the optimizers a Lightning ``training_step`` toggles in turn) directly in a framework
        step, that step: the framework calls it once per micro-batch, the loop runs over
        objects, not micro-batches."""
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Tuple | ast.List) and loop.iter.elts
                and all(dotted(e) is not None for e in loop.iter.elts)):
            return loop
        up = self.parents.get(loop)
        while up is not None and not isinstance(up, LOOPS + SCOPES):
            up = self.parents.get(up)
        return up if isinstance(up, FUNCS) and self._framework_step(up) else loop

    def _framework_step(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """``training_step``/``train_step`` that a framework calls once per micro-batch (a
        method, or a function the file never calls by name): a window of its own. A
        module-level ``train_step`` the file's loop calls is a backward helper."""
        if not (fn.name in WINDOW_FUNCS or fn.name.startswith("training_step")):
            return False
        if isinstance(self.parents.get(fn), ast.ClassDef):
            # an in-house trainer's own loop calling `self.training_step(batch)` per
            # micro-batch makes it a backward helper, as a framework's loop would
            return not any(self.enclosing(c, LOOPS) is not None
                           for c in self._call_index()[2].get(fn.name, ()))
        return not self._call_index()[1].get(fn.name)

    def _call_index(self) -> tuple[dict[str, int], dict[str, list[ast.Call]], dict[str, list[ast.Call]]]:
        """How often each function name is defined, the ``name(...)`` calls and the
        ``self.name(...)`` calls by name: one pass over the file (per helper it was quadratic)."""
        def compute() -> tuple[dict[str, int], dict[str, list[ast.Call]], dict[str, list[ast.Call]]]:
            defs: dict[str, int] = {}
            for f in self.of(*FUNCS):
                defs[f.name] = defs.get(f.name, 0) + 1
            by_name: dict[str, list[ast.Call]] = {}
            by_self: dict[str, list[ast.Call]] = {}
            for n in self.of(ast.Call):
                if isinstance(n.func, ast.Name):
                    by_name.setdefault(n.func.id, []).append(n)
                elif (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                        and n.func.value.id == "self"):
                    by_self.setdefault(n.func.attr, []).append(n)
            return defs, by_name, by_self
        return self._cached("call_index", self.tree, compute)  # type: ignore[no-any-return]

    def _instance_calls(self) -> dict[str, list[ast.Call]]:
        """``obj.name(...)`` calls by method name, ``obj`` a name or attribute other than
        ``self`` (``learner.accumulate(batch)``: a method of the file's class run through an
        instance of it; :meth:`_instances` tells which class)."""
        def compute() -> dict[str, list[ast.Call]]:
            out: dict[str, list[ast.Call]] = {}
            for n in self.of(ast.Call):
                if isinstance(n.func, ast.Attribute) \
                        and isinstance(n.func.value, ast.Name | ast.Attribute) \
                        and not (isinstance(n.func.value, ast.Name) and n.func.value.id == "self"):
                    out.setdefault(n.func.attr, []).append(n)
            return out
        return self._cached("instance_calls", self.tree, compute)  # type: ignore[no-any-return]

    def window_backwards(self, window: ast.AST) -> list[ast.Call]:
        """The backward calls of ``window``, where the call of a backward helper stands for
        the helper's backward (at the call's place in the window)."""
        out = [n for n in self.local_nodes(window) if isinstance(n, ast.Call) and is_backward(n)]
        out += list(self.inlined(window).values())
        return sorted(out, key=position)

    def backward_scopes(self, window: ast.AST) -> list[tuple[ast.AST, ast.Call]]:
        """(where its names are read, backward call) for each backward of ``window``: its own
        (read in the window's function), and those of the backward helpers it calls once per
        micro-batch (a trainer's ``self.micro_step(batch, i)``), each read in its helper."""
        own = [(self.window_scope(window), n) for n in self.local_nodes(window)
               if isinstance(n, ast.Call) and is_backward(n)]
        return own + [(helper, n) for helper in self.inlined(window)
                      for n in self.local_nodes(helper) if isinstance(n, ast.Call) and is_backward(n)]

    def guarded(self, node: ast.AST, window: ast.AST) -> bool:
        """Is ``node`` only reached at an accumulation boundary (within ``window``)? A call of a
        backward helper the window inlines is guarded by the helper's own ``if``s or by those
        around the helper's call in the window."""
        if super().guarded(node, window):
            return True
        links = {**self.reached(window), **self.inlined(window)}
        if not links:
            return False
        helper = self.enclosing(node, FUNCS)
        followed: set[ast.AST] = set()
        while helper is not None and helper not in followed:
            site = links.get(helper)
            if site is None:
                return False
            followed.add(helper)
            if super().guarded(node, helper):
                return True  # the helper's own `if` (`if (self.it + 1) % self.k == 0:`)
            if super().guarded(site, window):
                return True  # an `if` around the call in the window
            node, helper = site, self.enclosing(site, FUNCS)  # a helper calling a helper
        return False

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
                if isinstance(sub, ast.If) and (has_mod(sub.test) or self._mod_flag(sub.test, node)
                                                or self.counter_bound(sub.test) is not None) \
                        and self._gates_step(sub):
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
            if not any(accum_name(i) for i in idents):
                return False
            # K named only where the code checks or reports (`assert len(xs) == K * W`,
            # `print(..., grad_accum)`: a reference loop's checks) does not accumulate
            said = {id(x) for sub in [*self.local_nodes(node), *skip]
                    if sub in skip or checks_or_reports(sub) or assembles_window(sub)
                    for x in walk_all(sub)}
            return any(accum_name(i) for sub in self.local_nodes(node)
                       if id(sub) not in said for i in own_identifier(sub))

        if skip:
            return compute()
        return bool(self._cached("scope_accum", node, compute))

    def _mod_flag(self, test: ast.AST, scope: ast.AST) -> bool:
        """``test`` is a name ``scope`` assigns from a modulo (``ready = (i + 1) % K == 0``),
        or a call of a function of the file whose one ``return`` is a modulo test
        (``if self._is_boundary(batch_idx):``)."""
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name | ast.Attribute):
            name = test.func.id if isinstance(test.func, ast.Name) else test.func.attr
            defs = self.defs_by_name().get(name, [])
            rets = [r.value for r in walk_local(defs[0]) if isinstance(r, ast.Return)] \
                if len(defs) == 1 else []
            return len(rets) == 1 and rets[0] is not None and has_mod(rets[0])
        if not isinstance(test, ast.Name):
            return False

        def compute() -> set[str]:  # once per scope: asked for every `if name:` in it
            return {t.id for n in self.local_nodes(scope)
                    if isinstance(n, ast.Assign) and has_mod(n.value)
                    for t in n.targets if isinstance(t, ast.Name)}

        return test.id in self._cached("mod_flags", scope, compute)

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
        if any(self._scope_shows_accumulation(h) for h in (*self.inlined(window), *self.reached(window))):
            return True  # the backward helper run per micro-batch gates its own step
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

    def window_facts(self, window: ast.AST) -> WindowFacts:
        """The classified calls of ``window`` and whether it accumulates (cached)."""
        return self._cached("facts", window, lambda: self._window_facts(window))  # type: ignore[no-any-return]

    def _window_facts(self, window: ast.AST) -> WindowFacts:
        f = WindowFacts(window)
        calls = [n for n in self.local_nodes(window) if isinstance(n, ast.Call)]
        for helper in (*self.inlined(window), *self.reached(window)):
            calls += [n for n in self.local_nodes(helper) if isinstance(n, ast.Call)]
        calls.sort(key=lambda n: (n.lineno, n.col_offset))
        closures = {h.name for h in self.inlined(window) if isinstance(h, FUNCS)}
        for call in calls:
            attr = call_attr(call)
            recv = receiver(call)
            if attr == "step":
                kind = self.kind_of_receiver(recv)
                if kind == "scaler" and call.args:
                    kind = "optimizer"
                elif call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in closures:
                    kind = "optimizer"  # `opt.step(closure)`: the closure protocol (LBFGS, SAM)
                if kind in ("optimizer", "scheduler", "engine"):
                    f.steps.append((call, kind))
            elif attr == "zero_grad" and recv is not None:
                kind = self.kind_of_receiver(recv)
                if kind == "other" and dotted(recv) in self.wrapper_instances():
                    continue  # a class of the file: its own zero_grad() is followed
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
        if ds is not None and ds_ga is None:  # `"gradient_accumulation_steps": K`, K a constant
            node = self.ds_finder().value_node(ds, "gradient_accumulation_steps")
            ds_ga = self.int_value(node) if node is not None else None
        f.accumulating = self.shows_accumulation(window, frozenset(summing)) or (
            ds_ga is not None and ds_ga > 1
        )
        iterates_micro_batches = isinstance(window, ast.For | ast.AsyncFor) and any(
            MICRO_ITER_RE.search(i) for i in iter_identifiers(window.iter)
        ) and not steps_by_window(self, window.iter) and not yields_windows(self, window.iter)
        if iterates_micro_batches or (not f.accumulating and (
                self._averages_over_own_iterations(window, f) or self._steps_after_range_loop(window, f))):
            f.accumulating = True  # `for mb in window:` / `for micro in batch.chunk(K):`
        elif f.accumulating and not (ds_ga is not None and ds_ga > 1) and (
                self._plain_k1_shape(window, f) or whole_window_iteration(self, window)):
            f.accumulating = False
        # (or the optimizer's step sits in `accumulate()` inside a helper the window calls)
        f.accelerate = self.in_accelerate_accumulate(window, window) or any(
            k == "optimizer" and self.in_accelerate_accumulate(c, window) for c, k in f.steps)
        f.engine_steps_unguarded = any(
            k == "engine" and not self.guarded(c, window) for c, k in f.steps
        )
        if f.accumulating and f.accelerate:
            # Accelerate gates only the optimizers `prepare()` wrapped: a raw one steps on
            # every micro-step of `accumulate()`
            f.unguarded_optimizer_steps = [
                c for c, k in f.steps if k == "optimizer" and not self.guarded(c, window)
                and self.unprepared_optimizer(stepped_name(c))]
        if f.accumulating and not f.accelerate:
            f.unguarded_optimizer_steps = [
                c for c, k in f.steps if k == "optimizer" and not self.guarded(c, window)
            ]
            own = self._own_rate_optimizers(window, f)
            if own:
                f.own_rate = own
                f.unguarded_optimizer_steps = [
                    c for c in f.unguarded_optimizer_steps if stepped_name(c) not in own
                ]
        return f

    def _averages_over_own_iterations(self, window: ast.AST, f: WindowFacts) -> bool:
        """A loop that does not step the optimizer itself and divides something by its own
        number of iterations (``for x in group: (loss / len(group)).backward()``, ``for _ in
        range(n): ... / n``): the loss is averaged over the loop's micro-batches, one window."""
        if not isinstance(window, ast.For | ast.AsyncFor) or any(k == "optimizer" for _, k in f.steps):
            return False
        it = window.iter
        counts = [ast.dump(ast.Call(func=ast.Name("len", ast.Load()), args=[it], keywords=[]))]
        if isinstance(it, ast.Call) and dotted(it.func) == "range" and len(it.args) == 1:
            counts.append(ast.dump(it.args[0]))
        for n in self.local_nodes(window):
            right = n.right if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) else \
                n.value if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) else None
            if right is not None and ast.dump(right) in counts:
                return True
        return False

    def _steps_after_range_loop(self, window: ast.AST, f: WindowFacts) -> bool:
        """``for _ in range(X): ...backward()`` with no step of its own, followed in the
        enclosing block by an optimizer's ``.step()``: the loop is one window of X micro-batches
        whatever the names (``for k in range(K)``; nanoGPT's shape with short names)."""
        if not (isinstance(window, ast.For) and isinstance(window.iter, ast.Call)
                and dotted(window.iter.func) == "range" and len(window.iter.args) == 1
                and not isinstance(window.iter.args[0], ast.Constant) and not f.steps):
            return False
        parent = self.parents.get(window)
        body = next((b for b in (getattr(parent, "body", None), getattr(parent, "orelse", None))
                     if isinstance(b, list) and window in b), None)
        if body is None:
            return False
        for stmt in body[body.index(window) + 1:]:
            for call in walk_all(stmt):
                if isinstance(call, ast.Call) and call_attr(call) == "step" \
                        and self.kind_of_receiver(receiver(call)) in ("optimizer", "scaler"):
                    return True
        return False

    def window_k_names(self, window: ast.AST) -> set[str]:
        """The names that hold this window's K, read from its boundary: the divisor of the
        modulo in an ``if`` that gates a step (``(i + 1) % K == 0``, or a flag assigned from
        one), and ``X`` of a ``for _ in range(X)`` window that steps after the loop (cached).
        A loss divided by one of them is divided by the accumulation count, whatever the name
        (``K``, ``self.n``)."""
        def compute() -> set[str]:
            out: set[str] = set()
            for scope in (window, *self.inlined(window)):
                nodes = self.local_nodes(scope)
                for sub in nodes:
                    if not (isinstance(sub, ast.If) and self._gates_step(sub)):
                        continue
                    tests: list[ast.AST] = [sub.test]
                    if isinstance(sub.test, ast.Name):
                        tests += [n.value for n in nodes if isinstance(n, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == sub.test.id for t in n.targets)]
                    out |= {d for t in tests for m in walk_all(t)
                            if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) and has_mod(m)
                            and (d := dotted(m.right)) is not None}
                    bound = self.counter_bound(sub.test)
                    if bound is not None and (d := dotted(bound)) is not None:
                        out.add(d)
            if (isinstance(window, ast.For) and isinstance(window.iter, ast.Call)
                    and dotted(window.iter.func) == "range" and len(window.iter.args) == 1
                    and not self.window_facts(window).steps
                    and (d := dotted(window.iter.args[0])) is not None):
                out.add(d)  # `for micro in range(K): ...backward()` then the step after it
            return out
        return self._cached("window_k", window, compute)  # type: ignore[no-any-return]

    def is_window(self, node: ast.AST) -> bool:
        windows = self._cached("window_set", self.tree, lambda: set(self.windows()))
        return node in windows

    def window_itself_accumulates(self, window: ast.AST) -> bool:
        """The window's own code (or a backward helper it calls) shows accumulation, not
        only its function, class or module."""
        return self._scope_shows_accumulation(window) or any(
            self._scope_shows_accumulation(h) for h in self.inlined(window))

    def _plain_k1_shape(self, window: ast.AST, f: WindowFacts) -> bool:
        """backward, step and zero_grad all unguarded in the window, and nothing in the window
        itself says accumulation (the evidence was elsewhere in the function or file, e.g.
        ``micro_batch_size = 1`` or a reference loop over whole windows): one step per
        backward, nothing accumulated, K = 1. An accumulation name that only builds the
        batch (``torch.cat([get_batch(it, m) for m in range(grad_accum)])``, a slice
        ``batches[w0:w0 + grad_accum]``, ``range(0, n, grad_accum)`` as the loop's own
        iterable, an inner loop with no backward that gathers the micro-batches) says the
        batch is a whole window: the large-batch reference's shape, K = 1."""
        if self.window_itself_accumulates(window) and not accum_only_builds_batch(self, window):
            return False
        if not any(k == "optimizer" and not self.guarded(c, window) for c, k in f.steps):
            return False
        if any(k == "optimizer" and self.guarded(c, window) and self._boundary_gated(c, window)
               for c, k in f.steps):
            return False  # another optimizer steps at a boundary test: not one step per backward
        return any(not self.guarded(z, window) for z, _ in f.zero_grads) or (
            accum_only_builds_batch(self, window) and self._resets_grads_by_hand(window))

    def _boundary_gated(self, call: ast.AST, window: ast.AST) -> bool:
        """An ``if`` between ``call`` and ``window`` (through the helpers' call sites) whose
        test is a modulo, a flag or a function that returns one: a boundary test."""
        links = {**self.reached(window), **self.inlined(window)}
        cur: ast.AST | None = call
        for _ in range(64):
            parent = self.parents.get(cur) if cur is not None else None
            if parent is None or parent is window:
                return False
            if isinstance(parent, ast.If) and (has_mod(parent.test) or self._mod_flag(
                    parent.test, self.scope_of(parent))):
                return True
            if isinstance(parent, FUNCS) and parent in links:
                parent = links[parent]  # up through the helper's call site
            cur = parent
        return False

    def _resets_grads_by_hand(self, window: ast.AST) -> bool:
        """The window (or a helper it calls) clears gradients without ``zero_grad()``:
        ``p.grad = None``, ``p.grad.zero_()``, ``p.main_grad.zero_()`` (fp32 gradient buffers
        of a mixed-precision loop), not under a condition."""
        for scope in (window, *self.inlined(window), *self.reached(window)):
            for n in self.local_nodes(scope):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) \
                        and n.value.value is None and any(
                            isinstance(t, ast.Attribute) and "grad" in t.attr for t in n.targets):
                    hit: ast.AST = n
                elif isinstance(n, ast.Call) and call_attr(n) in ("zero_", "fill_") and isinstance(
                        r := receiver(n), ast.Attribute) and "grad" in r.attr:
                    hit = n
                else:
                    continue
                if scope is not window or not self.guarded(hit, window):
                    return True
        return False


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
