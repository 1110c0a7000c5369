"""Which functions of the file a window runs, and through which call: the calls a window
makes on every micro-step may sit several helpers deep.

Two questions, both answered from one index of the file's definitions and calls:

* :meth:`ReachFacts.callee_of` — the one function of the file a call runs: ``name(...)``
  (a function, module-level or nested), ``self.name(...)`` (a method of the caller's own
  class) or ``obj.name(...)`` for an instance of a wrapper class of the file
  (:meth:`~._ctx_file.FileIndex.wrapper_instances`) or of a plain helper class of the file (a
  gradient monitor, :meth:`~._ctx_file.FileIndex.helper_instances`); None when the name is
  defined more than once (which one runs cannot be told).
* :meth:`ReachFacts.reach_from` — the functions without a backward of their own that a
  window (and its backward helpers) calls, followed through helpers calling helpers up to
  :data:`MAX_DEPTH` deep: ``self._update()`` -> ``self._apply()`` -> ``self.opt.step()``.
  Each is mapped to the call that runs it, so that "is this step only reached at the
  boundary?" can be asked of every link of the chain.
* :meth:`ReachFacts.passed_call_sites` — a function handed to another function of the file
  as an argument (``run_epoch(step_fn, loader)``, ``trainer.fit(loop_body)`` with ``fit`` a
  method of the file, ``functools.partial(step_fn, ...)``) runs where that function calls
  the parameter it was bound to (``for b in loader: fn(b)``).
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, WINDOW_FUNCS, dotted, is_backward, last_part
from accumguard.static.lint._ctx_boundary import BoundaryFacts

#: helpers calling helpers are followed this many calls deep from the window
MAX_DEPTH = 4

Func = ast.FunctionDef | ast.AsyncFunctionDef


class ReachFacts(BoundaryFacts):
    """Calls resolved to the file's functions, and the helpers a window runs."""

    def callee_of(self, call: ast.Call) -> Func | None:
        """The function of the file ``call`` runs, when the file defines that name once."""
        if isinstance(call.func, ast.Name) and (
                cls := self.callable_instances().get(call.func.id)) is not None:
            hits = [f for f in cls.body if isinstance(f, FUNCS) and f.name == "__call__"]
            return hits[0]  # `loss_scaler(loss, optimizer, ...)`: the class's own __call__
        if isinstance(call.func, ast.Name):
            name, method = call.func.id, False
        elif (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
              and call.func.value.id == "self"):
            name, method = call.func.attr, True
        elif isinstance(call.func, ast.Attribute) and (cls := self.wrapper_instances().get(
                dotted(call.func.value) or "")) is not None:
            hits = [f for f in cls.body if isinstance(f, FUNCS) and f.name == call.func.attr]
            return hits[0] if len(hits) == 1 else None  # `optim_wrapper.step()`: the class's own step
        elif isinstance(call.func, ast.Attribute) and (cls := self.helper_instances().get(
                dotted(call.func.value) or "")) is not None:
            hits = [f for f in cls.body if isinstance(f, FUNCS) and f.name == call.func.attr]
            return hits[0] if len(hits) == 1 else None  # `monitor.observe(model)`: its method
        else:
            return None
        fns = self.defs_by_name().get(name, [])
        if len(fns) != 1:
            return None
        owner = self.parents.get(fns[0])
        if method != isinstance(owner, ast.ClassDef):
            return None
        if method and not self.inherits(self.enclosing(call, (ast.ClassDef,)), owner):
            return None
        return fns[0]

    def inherits(self, cls: ast.AST | None, owner: ast.AST | None) -> bool:
        """``cls`` is ``owner`` or a subclass of it in the file, a few levels deep (a
        subclass's ``fit`` calling ``self.training_step`` its base class defines)."""
        return (isinstance(cls, ast.ClassDef) and isinstance(owner, ast.ClassDef)
                and cls.name in self._family(owner.name))

    def _family(self, name: str) -> set[str]:
        """The class ``name`` and its subclasses in the file, subclasses of subclasses a few
        levels deep."""
        _, children = self._class_tree()
        family, frontier = {name}, [name]
        for _ in range(4):
            frontier = [c for n in frontier for c in children.get(n.lower(), ()) if c not in family]
            family.update(frontier)
        return family

    def self_method_overrides(self, call: ast.Call) -> list[Func]:
        """``self.hook()`` in a method of a file class whose name is defined more than once:
        the class's own ``hook`` and the ones its subclasses in the file override it with
        (a trainer's ``on_after_backward`` that a subclass fills in); empty otherwise."""
        if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
                and call.func.value.id == "self"):
            return []
        cls = self.enclosing(call, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef):
            return []
        methods, _ = self._class_tree()
        return [f for name in self._family(cls.name) for f in methods.get((name, call.func.attr), ())]

    def _class_tree(self) -> tuple[dict[tuple[str, str], list[Func]], dict[str, list[str]]]:
        """The file's methods by (class name, method name) and its classes' subclasses by the
        base's last name, lowercased (one pass, cached)."""
        def compute() -> tuple[dict[tuple[str, str], list[Func]], dict[str, list[str]]]:
            methods: dict[tuple[str, str], list[Func]] = {}
            children: dict[str, list[str]] = {}
            for c in self.of(ast.ClassDef):
                for f in c.body:
                    if isinstance(f, FUNCS):
                        methods.setdefault((c.name, f.name), []).append(f)
                for b in c.bases:
                    children.setdefault(last_part(dotted(b) or ""), []).append(c.name)
            return methods, children
        return self._cached("class_tree", self.tree, compute)  # type: ignore[no-any-return]

    def call_sites(self, fn: ast.AST) -> list[ast.Call]:
        """The calls of the file that :meth:`callee_of` resolves to ``fn`` (one index per file)."""
        def compute() -> dict[ast.AST, list[ast.Call]]:
            out: dict[ast.AST, list[ast.Call]] = {}
            for c in self.of(ast.Call):
                if (target := self.callee_of(c)) is not None:
                    out.setdefault(target, []).append(c)
            return out
        table: dict[ast.AST, list[ast.Call]] = self._cached("call_sites", self.tree, compute)
        return table.get(fn, [])

    def dispatched(self, call: ast.Call, fn: Func | None) -> list[Func]:
        """The methods a callback dispatcher of the file runs by name: ``self.fire(
        "on_after_backward")`` where ``fire`` calls ``getattr(cb, name)(...)`` with ``name``
        the parameter the string is bound to: every method of the file's classes by that
        name (the callbacks it may reach)."""
        if fn is None:
            return []
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        if params and params[0] == "self" and isinstance(call.func, ast.Attribute):
            params = params[1:]
        names = {p: a.value for p, a in zip(params, call.args, strict=False)
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        if not names:
            return []
        looked_up = {a.id for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                     and len(n.args) >= 2 for a in n.args[1:2] if isinstance(a, ast.Name)}
        methods, _ = self._class_tree()
        return [f for p, name in names.items() if p in looked_up
                for (_, m), fs in methods.items() if m == name for f in fs]

    def has_own_backward(self, fn: ast.AST) -> bool:
        """``fn`` runs a backward itself (outside nested definitions)."""
        return bool(self._cached("own_backward", fn, lambda: any(
            isinstance(n, ast.Call) and is_backward(n) for n in self.local_nodes(fn))))

    def reach_from(self, parts: tuple[ast.AST, ...]) -> dict[ast.AST, ast.Call]:
        """Functions without a backward of their own run from ``parts`` (a window and its
        backward helpers), each with the call that runs it (in a part or in another such
        function), breadth first up to :data:`MAX_DEPTH` calls deep. Dunder methods and
        functions the framework calls per micro-batch (``training_step``) are not followed."""
        out: dict[ast.AST, ast.Call] = {}
        seen: set[ast.AST] = set(parts)
        frontier: list[ast.AST] = list(parts)
        for _ in range(MAX_DEPTH):
            nxt: list[ast.AST] = []
            for part in frontier:
                for n in self.local_nodes(part):
                    if not isinstance(n, ast.Call):
                        continue
                    fn = self.callee_of(n)
                    targets = [fn] if fn is not None else self.self_method_overrides(n)
                    for f in [*targets, *self.dispatched(n, fn)]:
                        if (f in seen or f.name.startswith("__")
                                or f.name in WINDOW_FUNCS or self.has_own_backward(f)):
                            continue
                        seen.add(f)
                        out[f] = n
                        nxt.append(f)
            if not nxt:
                break
            frontier = nxt
        return out

    def passed_call_sites(self, helper: Func) -> list[ast.Call]:
        """Where a function handed over as an argument runs: ``g(helper, ...)`` /
        ``g(fn=helper)`` / ``g(functools.partial(helper, ...))`` with ``g`` a function of the
        file defined once (``obj.g(...)`` when ``g`` is the only definition of that name),
        and inside ``g`` the calls of the parameter it was bound to."""
        def compute() -> dict[ast.AST, list[ast.Call]]:
            out: dict[ast.AST, list[ast.Call]] = {}
            defs = self.defs_by_name()
            for ref in self.of(ast.Call):
                target = self._target_of_call(ref, defs)
                if target is None:
                    continue
                for param, arg in _bound_arguments(target, ref):
                    name = _function_named(arg)
                    fns = defs.get(name or "", [])
                    if len(fns) != 1 or fns[0] is target:
                        continue
                    out.setdefault(fns[0], []).extend(
                        n for n in self.local_nodes(target)
                        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == param)
            return out
        table: dict[ast.AST, list[ast.Call]] = self._cached("passed_sites", self.tree, compute)
        return table.get(helper, [])

    def _target_of_call(self, call: ast.Call, defs: dict[str, list[Func]]) -> Func | None:
        if not any(_function_named(a) for a in (*call.args, *(k.value for k in call.keywords))):
            return None
        direct = self.callee_of(call)
        if direct is not None:
            return direct
        if isinstance(call.func, ast.Attribute):
            fns = defs.get(call.func.attr, [])
            if len(fns) == 1 and isinstance(self.parents.get(fns[0]), ast.ClassDef):
                return fns[0]  # `MiniTrainer(loader).fit(loop_body)`, `fit` defined once
        return None


def _function_named(arg: ast.AST) -> str | None:
    """The function an argument names: ``step_fn`` or ``functools.partial(step_fn, ...)``."""
    if isinstance(arg, ast.Name):
        return arg.id
    if isinstance(arg, ast.Call) and last_part(dotted(arg.func)) == "partial" and arg.args \
            and isinstance(arg.args[0], ast.Name):
        return arg.args[0].id
    return None


def _bound_arguments(fn: Func, call: ast.Call) -> list[tuple[str, ast.AST]]:
    """(parameter name, argument) for the arguments of ``call`` that name a function."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        params = params[1:]
    out: list[tuple[str, ast.AST]] = []
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            break
        if i < len(params) and _function_named(a):
            out.append((params[i], a))
    for kw in call.keywords:
        if kw.arg is not None and _function_named(kw.value):
            out.append((kw.arg, kw.value))
    return out


__all__ = ["MAX_DEPTH", "ReachFacts", "FUNCS"]
