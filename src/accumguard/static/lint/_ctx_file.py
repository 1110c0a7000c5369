"""The base of a lint file context: one walk of the tree, and the facts of the whole file.

:class:`FileIndex` builds the parent map and the nodes by type in one traversal, caches
answers per node, tells what a name is (optimizer, scheduler, DeepSpeed engine), and holds
the script-level facts and the DeepSpeed config discovery (:mod:`._dsrefs`). The
boundary, window and value questions are answered by the classes built on it, joined in
:class:`~accumguard.static.lint._context.FileContext`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, TypeGuard

from accumguard.static.findings import RULES, Finding, lint_finding
from accumguard.static.lint._ast import (
    DDP_WRAPPERS,
    ENGINE_RE,
    FRAMEWORK_BACKWARD,
    FUNCS,
    OPTIM_RE,
    OPTIMIZER_CLASSES,
    SCALER_RE,
    SCHED_RE,
    SCHEDULER_CLASSES,
    SCOPES,
    call_attr,
    dotted,
    is_backward,
    last_part,
    receiver,
    walk_all,
    walk_local,
)
from accumguard.static.lint._dsrefs import DsConfigFinder, DsConfigRef

#: a collection of optimizers, by its name (``opts``, ``optimizers``, ``self.optims``)
_OPTIMS_RE = re.compile(r"^(opts|optims|optimi[sz]ers|[a-z_]*_opts|[a-z_]*_optimi[sz]ers)$")
#: collectives whose argument (or result) is then a value over every rank
_REDUCERS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "gather", "all_gather",
                       "reduce_tensor", "sync_tensor", "gather_for_metrics"})


class FileIndex:
    """The file's nodes, parents and whole-file facts, each computed once and cached."""

    def __init__(self, tree: ast.Module, path: Path | None) -> None:
        self.tree = tree
        self.path = path
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes: dict[type, list[ast.AST]] = {}
        wanted = (
            ast.Call, ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
            ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.With, ast.AsyncWith,
            ast.Import, ast.ImportFrom, ast.Dict, ast.Constant, ast.BinOp, ast.ClassDef, ast.Subscript,
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
        # accelerate imported and a .prepare(...) call: the model runs under DDP (or FSDP,
        # DeepSpeed) whenever it is launched on several processes
        self.accelerate = False
        self.accelerate_prepare = False
        self.explicit_ds_boundary = False
        self.boundary_flags: set[str] = set()
        self._assigns: list[tuple[list[str], ast.AST]] = []
        self._flags_ready = False
        self._cache: dict[tuple[str, int], Any] = {}
        self._collect_facts()
        self.ds_backward_receivers = self._collect_ds_backward_receivers()

    # ---------------------------------------------------------------- nodes and findings

    def bound_names(self) -> set[str]:
        """Every name the file binds: assigned (any target, loop and ``with`` targets
        included), a parameter, a function or class, an import. A name outside this set comes
        from outside the file (a notebook cell, a star import)."""
        def compute() -> set[str]:
            out: set[str] = set()
            for n in ast.walk(self.tree):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    out.add(n.id)
                elif isinstance(n, ast.arg):
                    out.add(n.arg)
                elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    out.add(n.name)
                elif isinstance(n, ast.alias):
                    out.add((n.asname or n.name).split(".")[0])
            return out
        return self._cached("bound_names", self.tree, compute)  # type: ignore[no-any-return]

    def functions_by_name(self) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
        """The file's function and method definitions by name (built once per file)."""
        def compute() -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
            out: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
            for node in self.of(ast.FunctionDef, ast.AsyncFunctionDef):
                out.setdefault(node.name, []).append(node)
            return out
        return self._cached("functions_by_name", self.tree, compute)  # type: ignore[no-any-return]

    def of(self, *types: type) -> list[Any]:
        """Nodes of the given types, in walk order per type."""
        out: list[ast.AST] = []
        for t in types:
            out.extend(self.nodes.get(t, ()))
        return out

    def finding(self, code: str, node: ast.AST, message: str, fix: str | None = None) -> Finding:
        """A script finding at ``node`` with the rule's severity, confidence and fix."""
        return lint_finding(
            code,
            message,
            fix=fix or RULES[code].fix,
            line=getattr(node, "lineno", 1),
            col=getattr(node, "col_offset", 0) + 1,
            end_line=getattr(node, "end_lineno", None),
            end_col=(getattr(node, "end_col_offset", None) or 0) + 1,
        )

    def _cached(self, kind: str, node: ast.AST, compute: Any) -> Any:
        key = (kind, id(node))
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def local_nodes(self, node: ast.AST) -> list[ast.AST]:
        """``walk_local(node)`` as a list, cached (windows and functions are walked by several rules)."""
        return self._cached("local", node, lambda: list(walk_local(node)))  # type: ignore[no-any-return]

    def assigned_in(self, scope: ast.AST) -> dict[str, list[ast.AST]]:
        """The values ``scope``'s own code assigns to each plain name (``x = ...``; nested
        scopes aside), in walk order; one pass per scope, cached."""
        def compute() -> dict[str, list[ast.AST]]:
            out: dict[str, list[ast.AST]] = {}
            for n in self.local_nodes(scope):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            out.setdefault(t.id, []).append(n.value)
            return out
        return self._cached("assigned_in", scope, compute)  # type: ignore[no-any-return]

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, kinds):
            cur = self.parents.get(cur)
        return cur

    def assignments(self) -> list[tuple[list[str], ast.AST]]:
        """Every ``names = value`` of the file (targets as dotted names), in source order."""
        return self._assigns

    def values_by_name(self) -> dict[str, list[ast.AST]]:
        """Per assigned name (dotted), the values assigned to it in source order (one pass
        over :meth:`assignments`, cached: rules look names up instead of rescanning)."""
        def compute() -> dict[str, list[ast.AST]]:
            out: dict[str, list[ast.AST]] = {}
            for targets, value in self._assigns:
                for t in dict.fromkeys(targets):
                    out.setdefault(t, []).append(value)
            return out
        return self._cached("values_by_name", self.tree, compute)  # type: ignore[no-any-return]

    def sole_values_by_name(self) -> dict[str, list[ast.AST]]:
        """Per name, the values of the file's one-target assignments to it (``n = ...``, not
        ``a = b = ...``), in source order (cached)."""
        def compute() -> dict[str, list[ast.AST]]:
            out: dict[str, list[ast.AST]] = {}
            for targets, value in self._assigns:
                if len(targets) == 1:
                    out.setdefault(targets[0], []).append(value)
            return out
        return self._cached("sole_values_by_name", self.tree, compute)  # type: ignore[no-any-return]

    def defs_by_name(self) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
        """The file's ``def`` and ``async def`` statements by name (cached)."""
        def compute() -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
            out: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
            for d in self.of(*FUNCS):
                out.setdefault(d.name, []).append(d)
            return out
        return self._cached("defs_by_name", self.tree, compute)  # type: ignore[no-any-return]

    def function_named(self, ref: ast.AST | None, at: ast.AST
                       ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The function of the file a reference names (a hook handed to a registration):
        ``self.m`` the method of the class ``at`` is in, a name the one ``def`` so named."""
        name = dotted(ref) if ref is not None else None
        if name is None:
            return None
        if name.startswith("self."):
            cls = self.enclosing(at, (ast.ClassDef,))
            hits = [f for f in getattr(cls, "body", []) if isinstance(f, FUNCS) and f.name == name[5:]]
        else:
            hits = self.defs_by_name().get(name.rsplit(".", 1)[-1], [])  # (case kept: `def sumHook`)
        return hits[0] if len(hits) == 1 else None

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function around ``node``, or the module."""
        return self.enclosing(node, FUNCS) or self.tree

    def window_scope(self, window: ast.AST) -> ast.AST:
        """The function whose names a window's statements read: the window itself when it is
        a function (``training_step`` called per micro-batch), else the one around it."""
        return window if isinstance(window, FUNCS) else self.scope_of(window)

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
                if any(m.split(".")[0] == "accelerate" for m in mods):
                    self.accelerate = True
            elif isinstance(node, ast.Call):
                name = call_attr(node) or ""
                if name in DDP_WRAPPERS:
                    self.ddp_wrapped = True
                if name == "prepare":
                    self.accelerate_prepare = True
                if name in ("coalesce_grad_reduction", "set_gradient_accumulation_boundary", "no_sync"):
                    self.explicit_ds_boundary = True
            else:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if value is None:
                    continue
                names: list[str] = []
                t0 = targets[0]
                if len(targets) == 1 and isinstance(t0, ast.Tuple | ast.List) \
                        and isinstance(value, ast.Tuple | ast.List) \
                        and len(t0.elts) == len(value.elts) \
                        and not any(isinstance(e, ast.Starred) for e in (*t0.elts, *value.elts)):
                    # `B, T, K = 4, 256, 8`: each name its own value
                    self._classify_unpack(t0, value)
                    for e, v in zip(t0.elts, value.elts, strict=True):
                        if (d := dotted(e)) is not None:
                            assigns.append(([d], v))
                    continue
                for t in targets:
                    if isinstance(t, ast.Tuple | ast.List):
                        names.extend(d for d in (dotted(e) for e in t.elts) if d)
                        self._classify_unpack(t, value)
                    elif (d := dotted(t)) is not None:
                        names.append(d)
                        self._classify_assign(d, value)
                assigns.append((names, value))
        self._assigns = assigns
        for loop in self.of(ast.For):
            # `for o in opts: o.step()`: the loop variable over a collection of optimizers
            # (named so, or a tuple/list of known ones) is one
            if not isinstance(loop.target, ast.Name):
                continue
            it = loop.iter
            elts = it.elts if isinstance(it, ast.Tuple | ast.List) else None
            src = dotted(it)
            if (elts and all((d := dotted(e)) is not None and (d in self.optimizers or OPTIM_RE.search(
                    last_part(d))) for e in elts)) or (src is not None and _OPTIMS_RE.search(
                    last_part(src))):
                self.optimizers.add(loop.target.id)

    def _classify_assign(self, target: str, value: ast.AST, *, nested: bool = False) -> None:
        if not isinstance(value, ast.Call):
            return
        callee = dotted(value.func) or ""
        last = last_part(callee)
        if last in OPTIMIZER_CLASSES or ("optim" in callee.lower() and "sched" not in callee.lower()):
            if "lr_scheduler" in callee or "sched" in last:
                self.schedulers.add(target)
            else:
                self.optimizers.add(target)
        elif "sched" in callee.lower() or last in SCHEDULER_CLASSES or re.search(
            r"schedule|^(step|multistep|exponential|cosine|onecycle|lambda|linear)lr", last
        ):
            self.schedulers.add(target)
        elif callee.startswith("deepspeed.") and last == "initialize":
            self.engines.add(target)
        elif isinstance(value.func, ast.Name) and not nested:
            # `ropt = make_opt(ref)`: a function of the file (defined once) whose every return
            # is a constructor call, or a name it assigns one
            for r in self._factory_returns(value.func.id):
                self._classify_assign(target, r, nested=True)

    def _classify_unpack(self, target: ast.Tuple | ast.List, value: ast.AST) -> None:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            self._classify_factory(target, value.func.id)
        if isinstance(value, ast.Call) and not value.args and dotted(value.func) in (
                "self.optimizers", "self.lr_schedulers"):
            # Lightning's manual optimisation: `opt_a, opt_b = self.optimizers()`
            kinds = self.optimizers if dotted(value.func) == "self.optimizers" else self.schedulers
            kinds.update(d for e in target.elts if (d := dotted(e)) is not None)
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

    def _classify_factory(self, target: ast.Tuple | ast.List, name: str) -> None:
        """``ropt, rsched = build_optim(model)``: a function of the file (defined once) whose
        every return is a tuple of that length gives each name the kind of what it returns
        there (a constructor call, or a name the function assigns one)."""
        self._classify_elements(target, self._factory_returns(name, width=len(target.elts)))

    def _classify_elements(self, target: ast.Tuple | ast.List, rets: list[ast.AST]) -> None:
        """Each name of an unpacking target gets the kind of the matching returned element,
        nested tuples too (``(o1, o2), (s1, s2) = build(model)``)."""
        for i, t in enumerate(target.elts):
            values = [r.elts[i] if isinstance(r, ast.Tuple) else r for r in rets]
            if isinstance(t, ast.Tuple | ast.List):
                inner = [v for v in values if isinstance(v, ast.Tuple) and len(v.elts) == len(t.elts)]
                if inner and len(inner) == len(values):
                    self._classify_elements(t, list(inner))
                continue
            d = dotted(t)
            if d is None:
                continue
            for v in values:
                self._classify_assign(d, v)

    def _factory_returns(self, name: str, width: int = 0) -> list[ast.AST]:
        """What a function of the file (defined once) returns, every ``return`` of it, a name
        it assigns once read as that value (in each element of a returned tuple too). With
        ``width``: only when every return is a tuple of that many elements; else empty."""
        fns = self.functions_by_name().get(name, [])
        if len(fns) != 1:
            return []
        # (its own returns: a nested `def lr_lambda(step): return ...` is not the factory's)
        rets = [r.value for r in ast.walk(fns[0]) if isinstance(r, ast.Return) and r.value is not None
                and self.enclosing(r, (*FUNCS, ast.Lambda)) is fns[0]]
        if width and not all(isinstance(r, ast.Tuple) and len(r.elts) == width for r in rets):
            return []
        local: dict[str, list[ast.AST]] = {}
        for n in ast.walk(fns[0]):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                local.setdefault(n.targets[0].id, []).append(n.value)

        def held(e: ast.expr) -> ast.expr:
            if isinstance(e, ast.Tuple):  # `return (o1, o2), (s1, s2)`
                return ast.Tuple([held(x) for x in e.elts], ast.Load())
            if isinstance(e, ast.Name) and len(local.get(e.id, [])) == 1:
                v = local[e.id][0]
                return v if isinstance(v, ast.expr) else e
            return e
        return [ast.Tuple([held(e) for e in r.elts], ast.Load()) if isinstance(r, ast.Tuple)
                else held(r) for r in rets]

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


    def _instances(self) -> dict[str, ast.ClassDef]:
        """Names bound only to instances of one class of the file (every assignment of the
        name a call of that class, or of a function of the file every ``return`` of which is
        such a call: ``self.opt = build_optimizer(model, cfg)``), each with the class
        (cached)."""
        def compute() -> dict[str, ast.ClassDef]:
            classes: dict[str, ast.ClassDef | None] = {}
            for c in self.of(ast.ClassDef):
                classes[c.name] = None if c.name in classes else c
            made = self._factories(classes)
            out: dict[str, ast.ClassDef] = {}
            for name, values in self.values_by_name().items():
                owners = {made.get(v.func.id, v.func.id) for v in values
                          if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)}
                if len(owners) != 1 or len(values) != sum(isinstance(v, ast.Call) for v in values):
                    continue
                cls = classes.get(next(iter(owners)))
                if cls is not None:
                    out[name] = cls
            return out
        return self._cached("instances", self.tree, compute)  # type: ignore[no-any-return]

    def _factories(self, classes: dict[str, ast.ClassDef | None]) -> dict[str, str]:
        """Functions of the file (defined once) whose every ``return`` is a call of one class
        of the file: function name -> class name."""
        out: dict[str, str] = {}
        for fname, defs in self.defs_by_name().items():
            if len(defs) != 1 or fname in classes:
                continue
            returns = [r.value for r in walk_local(defs[0]) if isinstance(r, ast.Return)]
            names = {r.func.id for r in returns if isinstance(r, ast.Call)
                     and isinstance(r.func, ast.Name) and classes.get(r.func.id) is not None}
            if len(names) == 1 and len(returns) == sum(isinstance(r, ast.Call) for r in returns):
                out[fname] = next(iter(names))
        return out

    def callable_instances(self) -> dict[str, ast.ClassDef]:
        """Names bound only to instances of one class of the file that defines ``__call__``
        (``loss_scaler = NativeScalerWithGradNormCount()``, also as the parameter of that
        name a training function is given): calling one runs that method (cached)."""
        def compute() -> dict[str, ast.ClassDef]:
            return {name: cls for name, cls in self._instances().items()
                    if any(isinstance(f, ast.FunctionDef) and f.name == "__call__"
                           for f in cls.body)}
        return self._cached("callable_instances", self.tree, compute)  # type: ignore[no-any-return]

    def wrapper_instances(self) -> dict[str, ast.ClassDef]:
        """Names bound only to instances of a class of the file that defines ``step`` or
        ``zero_grad`` itself and is no optimizer or scheduler subclass (``optim_wrapper =
        AccumulatingOptimizer(opt, 4)``): what its ``step()`` does is the class's own code,
        read by following the method (cached)."""
        def compute() -> dict[str, ast.ClassDef]:
            return {name: cls for name, cls in self._instances().items()
                    if not any(re.search(r"(optimizer|scheduler|lr|module)$",
                                         last_part(dotted(b)).lower()) for b in cls.bases)
                    and any(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                            and f.name in ("step", "zero_grad") for f in cls.body)}
        return self._cached("wrapper_instances", self.tree, compute)  # type: ignore[no-any-return]

    def helper_instances(self) -> dict[str, ast.ClassDef]:
        """Names bound only to instances of a plain class of the file (no base class, or
        ``object``: a gradient monitor, a logger), whose methods are the class's own code
        (cached). Modules, optimizers, datasets and framework subclasses are not: their
        calls run library code too."""
        def compute() -> dict[str, ast.ClassDef]:
            return {name: cls for name, cls in self._instances().items()
                    if all(dotted(b) == "object" for b in cls.bases)}
        return self._cached("helper_instances", self.tree, compute)  # type: ignore[no-any-return]

    def is_accelerator(self, expr: ast.AST | None) -> bool:
        """``expr`` names an Accelerate ``Accelerator``: its name says so, or it is assigned
        from ``Accelerator(...)`` in the file (``acc``, ``self.accel``)."""
        d = dotted(expr) if expr is not None else None
        if d is None:
            return False
        if "accelerator" in d.lower():
            return True

        def compute() -> set[str]:
            out: set[str] = set()
            for targets, value in self.assignments():
                if isinstance(value, ast.Call) and (
                        dotted(value.func) or "").rsplit(".", 1)[-1] == "Accelerator":
                    out.update(targets)
            return out
        return d in self._cached("accelerator_names", self.tree, compute)

    def is_step(self, node: ast.AST, kinds: tuple[str, ...] = ("optimizer",)) -> TypeGuard[ast.Call]:
        """``node`` is a ``.step()`` call on an object of one of ``kinds``
        (:meth:`kind_of_receiver`): ``opt.step()``, ``engine.step()``."""
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "step" and self.kind_of_receiver(node.func.value) in kinds

    def kind_of_receiver(self, recv: ast.AST | None) -> str:
        """'engine' | 'scheduler' | 'optimizer' | 'scaler' | 'other' for the object a method is called on."""
        name = dotted(recv)
        if name is None:
            # e.g. self.optimizers()[0].step() or opts[i].step()
            if isinstance(recv, ast.Subscript):
                return self.kind_of_receiver(recv.value)
            return "other"
        if name in self.wrapper_instances():
            return "other"  # a class of the file: its own step() is followed (ReachFacts.callee_of)
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
        if isinstance(recv, ast.Name):
            # `for s in scheds: s.step()`: the loop variable is one of the list's objects
            cur = self.parents.get(recv)
            while cur is not None and not isinstance(cur, SCOPES):
                if isinstance(cur, ast.For | ast.AsyncFor) and isinstance(cur.target, ast.Name) \
                        and cur.target.id == recv.id:
                    it = cur.iter
                    if isinstance(it, ast.Tuple | ast.List):  # `for o in (opt_a, opt_b):`
                        return self._one_kind(it.elts, name)
                    return self.kind_of_receiver(it) if isinstance(it, ast.Name | ast.Attribute) \
                        and dotted(it) != name else "other"
                if isinstance(cur, ast.For | ast.AsyncFor) and isinstance(cur.target, ast.Tuple):
                    kind = self._unpacked_kind(cur.target, cur.iter, recv.id, name)
                    if kind is not None:
                        return kind
                cur = self.parents.get(cur)
        return "other"

    def _one_kind(self, elts: list[ast.expr], name: str) -> str:
        """The kind all of ``elts`` share (Names/Attributes other than ``name``), else 'other'."""
        kinds = {self.kind_of_receiver(e) if isinstance(e, ast.Name | ast.Attribute)
                 and dotted(e) != name else "other" for e in elts}
        return kinds.pop() if len(kinds) == 1 else "other"

    def _unpacked_kind(self, target: ast.Tuple, it: ast.expr, var: str, name: str) -> str | None:
        """``for o, s in ((opt_a, sched_a), (opt_b, sched_b)):`` or ``for o, s in zip(opts,
        scheds):``: the kind of what ``var`` takes (None: ``var`` is not unpacked here)."""
        names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
        if var not in names:
            return None
        i = names.index(var)
        if isinstance(it, ast.Tuple | ast.List) and all(
                isinstance(e, ast.Tuple | ast.List) and len(e.elts) == len(names) for e in it.elts):
            return self._one_kind([e.elts[i] for e in it.elts], name)  # type: ignore[attr-defined]
        if isinstance(it, ast.Call) and dotted(it.func) == "zip" and len(it.args) == len(names):
            arg = it.args[i]
            return self.kind_of_receiver(arg) if isinstance(arg, ast.Name | ast.Attribute) \
                and dotted(arg) != name else "other"
        return "other"

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
                if isinstance(n, ast.Call) and call_attr(n) in _REDUCERS and n.args:
                    out.update(d for d in (dotted(s) for s in walk_all(n.args[0])) if d)
                elif isinstance(n, ast.Assign) and any(
                        isinstance(c, ast.Call) and call_attr(c) in _REDUCERS
                        for c in walk_all(n.value)):
                    # `n = accelerator.gather(torch.tensor([n_local])).sum().item()`: the
                    # result of a reduction over the ranks
                    out.update(d for d in (dotted(t) for t in n.targets) if d)
            # a name read from a reduced one (`n_tok = window_tokens[micro // K]`,
            # `n = total.item()`, `float(total)`): the same ranks' sum
            for n in self.local_nodes(scope):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                        and (src := read_of(n.value)) is not None and src in out:
                    out.update(d for d in (dotted(t) for t in n.targets) if d)
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

    def trainer_classes(self) -> list[ast.ClassDef]:
        """Classes whose base is named like a Trainer (``Trainer``, ``transformers.Trainer``,
        ``SFTTrainer``): a Hugging Face Trainer subclass, whose ``compute_loss`` and
        ``training_step`` it runs once per micro-batch."""
        return [cls for cls in self.of(ast.ClassDef)
                if any((last_part(dotted(b)) or "").endswith("trainer") for b in cls.bases)]

    def trainer_compute_losses(self) -> list[tuple[ast.ClassDef, ast.FunctionDef | ast.AsyncFunctionDef]]:
        """(class, method) for each ``compute_loss`` defined in a class whose base is named like
        a Trainer (``Trainer``, ``transformers.Trainer``, ``SFTTrainer``), cached: the Hugging
        Face Trainer calls it once per micro-batch."""
        def compute() -> list[tuple[ast.ClassDef, ast.FunctionDef | ast.AsyncFunctionDef]]:
            out: list[tuple[ast.ClassDef, ast.FunctionDef | ast.AsyncFunctionDef]] = []
            for cls in self.trainer_classes():
                out += [(cls, fn) for fn in cls.body
                        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name == "compute_loss"]
            return out
        return self._cached("compute_losses", self.tree, compute)  # type: ignore[no-any-return]

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


def _pos(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def read_of(value: ast.AST) -> str | None:
    """The dotted name ``value`` only reads: ``x[i]``, ``x.item()``, ``float(x)``, ``int(x)``,
    ``x.clamp(min=1)`` and their combinations; else None."""
    while True:
        if isinstance(value, ast.Subscript):
            value = value.value
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("item", "clamp", "clamp_min", "float", "long", "to", "detach"):
            value = value.func.value
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id in ("float", "int") and len(value.args) == 1:
            value = value.args[0]
        else:
            return dotted(value)
