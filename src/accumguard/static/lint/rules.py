"""AST analysis of training scripts for gradient-accumulation bugs (codes AG101..AG110).

How the analysis decides "inside the accumulation window" (the heuristics are
tuned for few false positives; docs/rules.md states each rule's confidence):

1. A *window* is the innermost loop whose body (not counting nested function
   or class definitions) calls ``.backward(`` — ``loss.backward()``,
   ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
   ``engine.backward(loss)``, ``self.manual_backward(loss)``. A function named
   ``training_step``/``train_step`` that calls backward outside any loop is a
   window too: the framework calls it once per micro-batch.
2. A window only counts as an *accumulation* window when the code shows
   accumulation: an accumulation-like name (``grad_accum*``,
   ``accumulation_steps``, ``micro_step``...), a modulo in an ``if`` that gates
   a step (``if i % 100 == 0: print()`` does not count), ``no_sync``, or
   ``accelerator.accumulate`` in the window, its enclosing function or class
   (or the module for top-level loops); for a DeepSpeed engine, a config named
   in the script with GA > 1. A plain K=1 loop that does backward and step
   every iteration is correct and never flagged.
3. A call in the window is *guarded* when an enclosing ``if`` (up to the
   window) tests a boundary: a modulo, a name that says last / boundary /
   sync / should_step / accumulation, or a variable assigned from such a test;
   or when an earlier ``if <boundary>: continue`` skips it. Optimizer and
   scheduler calls inside ``accelerator.accumulate(...)`` are gated by
   Accelerate itself and count as guarded (``model.zero_grad()`` and
   clipping do not).
4. One root cause, one finding: when the optimizer itself steps on every
   micro-step (AG101), the zero_grad/scheduler/clip next to it are consistent
   with that step and are not reported separately.

Nothing here imports or executes the script.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accumguard.static import dsconfig
from accumguard.static.findings import RULES, Finding

__all__ = ["LintError", "lint_file", "lint_paths", "lint_source"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# identifiers that show accumulation is going on
_ACCUM_RE = re.compile(
    r"grad(ient)?s?_?acc|accum|micro_?(batch|step|bs)|n_?micro|num_?micro|_micro$|^micro"
)
# identifiers that, in an `if` test, mean "this is the boundary"
_BOUNDARY_RE = re.compile(
    r"last|boundary|sync|final"
    r"|(should|do|take|need|time_to|ready_to|is)_?(to_)?(step|update|optim|apply)"
    r"|(step|update|optim)_?now"
)
_OPTIM_RE = re.compile(r"optim|^opt(_|\d|$)|_opt(\d*)$|^o?pt?imi[sz]er")
_SCHED_RE = re.compile(r"sched|^lr_?s|warmup")
_ENGINE_RE = re.compile(r"engine")
_SCALER_RE = re.compile(r"scaler")
_FRAMEWORK_BACKWARD = frozenset({"accelerator", "fabric", "self", "autograd", "torch", "amp"})
_CLIP_FUNCS = frozenset(
    {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients", "clip_grad_value"}
)
_UNSCALE_FUNCS = frozenset({"unscale_", "unscale_gradients"})
_TOKEN_MEAN_HINTS = re.compile(
    r"^(ignore_index|attention_mask|loss_mask|padding_mask|pad_token_id|label_mask|"
    r"labels_mask|token_mask|mask)$"
)
_TOKEN_NORMALISED = re.compile(r"token|num_items|n_items|count|n_valid|num_valid|denom|normali")
_WORLD_RE = re.compile(r"world|get_world_size|num_processes|nprocs|n_gpu|num_gpus|n_ranks|num_ranks")
_OPTIMIZER_CLASSES = frozenset(
    {"sgd", "adam", "adamw", "adagrad", "adadelta", "adamax", "nadam", "radam", "rmsprop", "lbfgs",
     "sparseadam", "adafactor", "lion", "lamb", "fusedadam", "deepspeedcpuadam", "adamw8bit",
     "paged_adamw", "muon", "optimizers", "configure_optimizers", "create_optimizer"}
)
# the tensor being all-reduced is a gradient (not grad_input/grad_output of a custom autograd op)
_GRAD_TENSOR_RE = re.compile(r"^(grad|grads|gradients?|flat_grads?|grad_buf\w*|\w+_grads?)$")
_WINDOW_FUNCS = frozenset({"training_step", "train_step"})

_SUPPRESS_RE = re.compile(r"#\s*accumguard:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?", re.IGNORECASE)


class LintError(Exception):
    """A file could not be analysed (syntax error, unreadable); carries a ruff-style location."""

    def __init__(self, path: str, line: int, col: int, message: str) -> None:
        self.path = path
        self.line = line
        self.col = col
        self.message = message
        super().__init__(f"{path}:{line}:{col}: {message}")


# --------------------------------------------------------------------------- small AST helpers


def dotted(node: ast.AST | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain; ``a.b()`` style calls give ``a.b()``; else None."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        elif isinstance(node, ast.Call) and not node.args and not node.keywords:
            inner = dotted(node.func)
            if inner is None:
                return None
            parts.append(inner + "()")
            return ".".join(reversed(parts))
        else:
            return None


def _last(name: str | None) -> str:
    """Last identifier of a dotted name, lower-cased (``self.optimizer`` -> ``optimizer``)."""
    if not name:
        return ""
    return name.rsplit(".", 1)[-1].rstrip("()").lower()


def _identifiers(node: ast.AST) -> Iterator[str]:
    """Every identifier in ``node`` (names, attributes, args, keywords), lower-cased."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id.lower()
        elif isinstance(sub, ast.Attribute):
            yield sub.attr.lower()
        elif isinstance(sub, ast.arg) or isinstance(sub, ast.keyword) and sub.arg:
            yield sub.arg.lower()


def _walk_local(node: ast.AST) -> Iterator[ast.AST]:
    """Like :func:`ast.walk` but does not enter nested function/class/lambda definitions."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in ast.iter_child_nodes(cur):
            if isinstance(child, _SCOPES):
                continue
            stack.append(child)


def _call_attr(call: ast.Call) -> str | None:
    """The method/function name of a call: ``x.y.step(...)`` -> ``step``, ``f(...)`` -> ``f``."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _receiver(call: ast.Call) -> ast.AST | None:
    return call.func.value if isinstance(call.func, ast.Attribute) else None


def _is_backward(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("backward", "manual_backward")


def _terminates(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Continue | ast.Return | ast.Break | ast.Raise)


def _has_mod(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Mod)
            and not (isinstance(sub.left, ast.Constant) and isinstance(sub.left.value, str | bytes))
        ):
            return True
    return False


# --------------------------------------------------------------------------- analysis


@dataclass
class _Ctx:
    """Per-file facts collected once before the rules run."""

    tree: ast.Module
    path: Path | None
    parents: dict[ast.AST, ast.AST]
    boundary_flags: set[str]
    optimizers: set[str]
    schedulers: set[str]
    engines: set[str]
    deepspeed: bool
    ddp_wrapped: bool
    explicit_ds_boundary: bool


class _Linter:
    def __init__(self, tree: ast.Module, path: Path | None) -> None:
        # one walk: the parent map and the nodes each rule looks at (walks dominate the cost)
        parents: dict[ast.AST, ast.AST] = {}
        self.nodes: dict[type, list[ast.AST]] = {}
        wanted = (
            ast.Call, ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
            ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.With, ast.AsyncWith, ast.Import,
            ast.ImportFrom, ast.Dict, ast.Constant,
        )
        for node in ast.walk(tree):
            if isinstance(node, wanted):
                self.nodes.setdefault(type(node), []).append(node)
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        self.ctx = _Ctx(
            tree=tree,
            path=path,
            parents=parents,
            boundary_flags=set(),
            optimizers=set(),
            schedulers=set(),
            engines=set(),
            deepspeed=False,
            ddp_wrapped=False,
            explicit_ds_boundary=False,
        )
        self.findings: list[Finding] = []
        self._assigns: list[tuple[list[str], ast.AST]] = []
        self._flags_ready = False
        self._ds_config_cache: tuple[int | None, str] | None = None
        self._ds_config_searched = False
        self._collect_facts()
        self._ds_backward_receivers = self._collect_ds_backward_receivers()

    # ---------------------------------------------------------------- facts

    def _of(self, *types: type) -> list[Any]:
        """Nodes of the given types, in walk order per type."""
        out: list[ast.AST] = []
        for t in types:
            out.extend(self.nodes.get(t, ()))
        return out

    def _collect_facts(self) -> None:
        ctx = self.ctx
        assigns: list[tuple[list[str], ast.AST]] = []
        for node in self._of(
            ast.Import, ast.ImportFrom, ast.Call, ast.Assign, ast.AnnAssign, ast.NamedExpr
        ):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module:
                    mods.append(node.module)
                if any(m.split(".")[0] == "deepspeed" for m in mods):
                    ctx.deepspeed = True
            elif isinstance(node, ast.Call):
                name = _call_attr(node) or ""
                if name in ("DistributedDataParallel", "DDP", "fully_shard", "FullyShardedDataParallel", "FSDP"):
                    ctx.ddp_wrapped = True
                if name in ("coalesce_grad_reduction", "set_gradient_accumulation_boundary", "no_sync"):
                    ctx.explicit_ds_boundary = True
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
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

    def _ensure_boundary_flags(self) -> None:
        """Names assigned from a boundary test (``is_last = k == K - 1``), to a fixpoint.

        Computed on first use: only files with an accumulation window need it.
        """
        if self._flags_ready:
            return
        self._flags_ready = True
        flags = self.ctx.boundary_flags
        for _ in range(4):
            before = len(flags)
            for names, value in self._assigns:
                if names and not flags.issuperset(names) and self._is_boundary_test(value):
                    flags.update(names)
            if len(flags) == before:
                break

    def _classify_assign(self, target: str, value: ast.AST) -> None:
        if not isinstance(value, ast.Call):
            return
        callee = dotted(value.func) or ""
        last = _last(callee)
        if last in _OPTIMIZER_CLASSES or ("optim" in callee.lower() and "sched" not in callee.lower()):
            if "lr_scheduler" in callee or "sched" in last:
                self.ctx.schedulers.add(target)
            else:
                self.ctx.optimizers.add(target)
        elif "sched" in callee.lower() or re.search(r"schedule|^(step|multistep|exponential|cosine|onecycle|lambda|linear)lr", last):
            self.ctx.schedulers.add(target)
        elif callee.startswith("deepspeed.") and last == "initialize":
            self.ctx.engines.add(target)

    def _classify_unpack(self, target: ast.Tuple | ast.List, value: ast.AST) -> None:
        if isinstance(value, ast.Call) and _last(dotted(value.func)) == "initialize":
            callee = dotted(value.func) or ""
            if "deepspeed" in callee or self.ctx.deepspeed:
                elts = target.elts
                if elts and (d := dotted(elts[0])):
                    self.ctx.engines.add(d)
                if len(elts) > 1 and (d := dotted(elts[1])):
                    self.ctx.optimizers.add(d)
                if len(elts) > 3 and (d := dotted(elts[3])):
                    self.ctx.schedulers.add(d)

    # ---------------------------------------------------------------- classification

    def _is_boundary_test(self, expr: ast.AST) -> bool:
        self._ensure_boundary_flags()
        if _has_mod(expr):
            return True
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Name | ast.Attribute):
                d = dotted(sub)
                if d and d in self.ctx.boundary_flags:
                    return True
                ident = (sub.id if isinstance(sub, ast.Name) else sub.attr).lower()
                if _BOUNDARY_RE.search(ident) or _ACCUM_RE.search(ident):
                    return True
            elif isinstance(sub, ast.Call) and _call_attr(sub) == "len":
                # `i == len(loader) - 1`: the last batch, i.e. a boundary
                parent = self.ctx.parents.get(sub)
                if isinstance(parent, ast.BinOp | ast.Compare):
                    return True
        return False

    def _kind_of_receiver(self, recv: ast.AST | None) -> str:
        """'engine' | 'scheduler' | 'optimizer' | 'scaler' | 'other' for the object a method is called on."""
        name = dotted(recv)
        if name is None:
            # e.g. self.optimizers()[0].step() or opts[i].step()
            if isinstance(recv, ast.Subscript):
                return self._kind_of_receiver(recv.value)
            return "other"
        last = _last(name)
        if name in self.ctx.engines or _ENGINE_RE.search(last):
            return "engine"
        if name in self.ctx.schedulers or _SCHED_RE.search(last):
            return "scheduler"
        if name in self.ctx.optimizers or _OPTIM_RE.search(last):
            return "optimizer"
        if _SCALER_RE.search(last):
            return "scaler"
        if self.ctx.deepspeed and name in self._ds_backward_receivers:
            return "engine"
        return "other"

    # ---------------------------------------------------------------- windows

    def _contains_backward(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and _is_backward(n) for n in _walk_local(node))

    def _windows(self) -> list[ast.AST]:
        # innermost loop (and window function) above each backward call, not crossing scopes
        out: list[ast.AST] = []
        seen: set[ast.AST] = set()
        for call in self._of(ast.Call):
            if not _is_backward(call):
                continue
            cur = self.ctx.parents.get(call)
            while cur is not None and not isinstance(cur, _LOOPS + _SCOPES):
                cur = self.ctx.parents.get(cur)
            if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef) and not (
                cur.name in _WINDOW_FUNCS or cur.name.startswith("training_step")
            ):
                continue
            if cur is None or isinstance(cur, ast.ClassDef | ast.Lambda) or cur in seen:
                continue
            seen.add(cur)
            out.append(cur)
        # a loop that contains a window loop is not itself a window (nanoGPT: outer loop steps)
        out = [
            w
            for w in out
            if not any(o is not w and isinstance(o, _LOOPS) and o in seen for o in _walk_local(w))
        ]
        out.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        return out

    def _enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        cur = self.ctx.parents.get(node)
        while cur is not None and not isinstance(cur, kinds):
            cur = self.ctx.parents.get(cur)
        return cur

    def _scope_shows_accumulation(self, node: ast.AST) -> bool:
        for sub in _walk_local(node):
            # a modulo that gates a step (not `if i % 100 == 0: print(...)`) shows accumulation
            if isinstance(sub, ast.If) and _has_mod(sub.test) and self._gates_step(sub):
                return True
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("no_sync", "accumulate", "no_backward_sync")
                and dotted(sub.func.value) != "itertools"
            ):
                return True
        # bare `accumulate` is itertools.accumulate / index_put_(accumulate=True), not evidence;
        # accelerator.accumulate(model) was caught above as a call
        return any(_ACCUM_RE.search(i) for i in self._local_identifiers(node) if i != "accumulate")

    @staticmethod
    def _gates_step(node: ast.If) -> bool:
        for stmt in (*node.body, *node.orelse):
            for sub in _walk_local(stmt):
                if isinstance(sub, ast.Call) and _call_attr(sub) in ("step", "zero_grad"):
                    return True
        return _terminates(node.body)

    def _local_identifiers(self, node: ast.AST) -> Iterator[str]:
        for sub in _walk_local(node):
            if isinstance(sub, ast.Name):
                yield sub.id.lower()
            elif isinstance(sub, ast.Attribute):
                yield sub.attr.lower()
            elif isinstance(sub, ast.arg) or isinstance(sub, ast.keyword) and sub.arg:
                yield sub.arg.lower()

    def _shows_accumulation(self, window: ast.AST) -> bool:
        if self._scope_shows_accumulation(window):
            return True
        fn = window if isinstance(window, ast.FunctionDef | ast.AsyncFunctionDef) else self._enclosing(
            window, (ast.FunctionDef, ast.AsyncFunctionDef)
        )
        if fn is None:
            return self._scope_shows_accumulation(self.ctx.tree)
        if self._scope_shows_accumulation(fn):
            return True
        cls = self._enclosing(fn, (ast.ClassDef,))
        if cls is not None:
            return any(_ACCUM_RE.search(i) for i in _identifiers(cls) if i != "accumulate")
        return False

    def _in_accelerate_accumulate(self, node: ast.AST, window: ast.AST) -> bool:
        """True when ``node`` is under ``with <x>.accumulate(...)`` (or the window is)."""
        cur: ast.AST | None = node
        while cur is not None:
            if isinstance(cur, ast.With | ast.AsyncWith):
                for item in cur.items:
                    e = item.context_expr
                    if isinstance(e, ast.Call) and _call_attr(e) == "accumulate" and isinstance(e.func, ast.Attribute):
                        return True
            if isinstance(cur, ast.Module):
                break
            cur = self.ctx.parents.get(cur)
        # `with accelerator.accumulate(model):` inside the loop but the call after it
        return any(
            isinstance(sub, ast.Call) and _call_attr(sub) == "accumulate" and isinstance(sub.func, ast.Attribute)
            for sub in _walk_local(window)
        )

    def _guarded(self, node: ast.AST, window: ast.AST) -> bool:
        """Is ``node`` only reached at an accumulation boundary (within ``window``)?"""
        child = node
        cur = self.ctx.parents.get(node)
        while cur is not None:
            if isinstance(cur, ast.If | ast.IfExp) and child is not cur.test and self._is_boundary_test(cur.test):
                return True
            if isinstance(cur, ast.While) and cur is not window and self._is_boundary_test(cur.test):
                return True
            # an earlier `if <boundary>: continue` (or the else branch) in the same block
            for body_name in ("body", "orelse", "finalbody"):
                body = getattr(cur, body_name, None)
                if isinstance(body, list) and child in body:
                    for prev in body[: body.index(child)]:
                        if (
                            isinstance(prev, ast.If)
                            and self._is_boundary_test(prev.test)
                            and (_terminates(prev.body) or _terminates(prev.orelse))
                        ):
                            return True
            if cur is window:
                return False
            child = cur
            cur = self.ctx.parents.get(cur)
        return False

    # ---------------------------------------------------------------- rules

    def run(self) -> list[Finding]:
        for window in self._windows():
            self._check_window(window)
        self._check_sync_flags()
        self._check_manual_all_reduce()
        return self.findings

    def _collect_ds_backward_receivers(self) -> set[str]:
        out: set[str] = set()
        if not self.ctx.deepspeed:
            return out
        for n in self._of(ast.Call):
            if _is_backward(n) and n.args:
                name = dotted(_receiver(n))
                if name and _last(name) not in _FRAMEWORK_BACKWARD and "scale" not in name:
                    out.add(name)
        return out

    def _add(self, code: str, node: ast.AST, message: str, fix: str | None = None) -> None:
        rule = RULES[code]
        self.findings.append(
            Finding(
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
        )

    def _check_window(self, window: ast.AST) -> None:
        calls = [n for n in _walk_local(window) if isinstance(n, ast.Call)]
        calls.sort(key=lambda n: (n.lineno, n.col_offset))
        steps: list[tuple[ast.Call, str]] = []
        zero_grads: list[tuple[ast.Call, str]] = []
        clips: list[ast.Call] = []
        engine_backward = False
        for call in calls:
            attr = _call_attr(call)
            recv = _receiver(call)
            if attr == "step":
                kind = self._kind_of_receiver(recv)
                if kind == "scaler" and call.args:
                    kind = "optimizer"
                if kind in ("optimizer", "scheduler", "engine"):
                    steps.append((call, kind))
            elif attr == "zero_grad" and recv is not None:
                kind = self._kind_of_receiver(recv)
                if kind != "engine":
                    zero_grads.append((call, "optimizer" if kind == "optimizer" else "model"))
            elif attr in _CLIP_FUNCS or (attr in _UNSCALE_FUNCS and recv is not None):
                clips.append(call)
            elif _is_backward(call) and self._kind_of_receiver(recv) == "engine" and call.args:
                engine_backward = True

        ds_ga = self._deepspeed_window(window, steps, engine_backward)
        if not self._shows_accumulation(window) and not (ds_ga is not None and ds_ga > 1):
            return
        accelerate = self._in_accelerate_accumulate(window, window)
        engine_steps_unguarded = any(k == "engine" and not self._guarded(c, window) for c, k in steps)

        bad_step = False
        for call, kind in steps:
            if kind != "optimizer" or self._guarded(call, window) or accelerate:
                continue
            bad_step = True
            name = dotted(_receiver(call)) or "optimizer"
            self._add(
                "AG101",
                call,
                f"`{name}.step()` runs on every micro-batch of this accumulation loop (line "
                f"{getattr(window, 'lineno', '?')}) with no boundary condition: the optimizer takes K "
                "small steps instead of one",
            )
        if bad_step:
            return
        for call, kind in zero_grads:
            if self._guarded(call, window) or (accelerate and kind == "optimizer"):
                continue
            name = dotted(_receiver(call)) or "model"
            extra = (
                " (Accelerate gates the prepared optimizer's zero_grad, not the model's)"
                if accelerate
                else ""
            )
            self._add(
                "AG102",
                call,
                f"`{name}.zero_grad()` on every micro-batch erases the gradients accumulated so far: "
                f"only the last micro-batch reaches the optimizer{extra}",
            )
        for call, kind in steps:
            if kind != "scheduler" or self._guarded(call, window) or accelerate:
                continue
            if engine_steps_unguarded and ds_ga is None and not self._shows_accumulation(window):
                continue
            name = dotted(_receiver(call)) or "scheduler"
            self._add(
                "AG103",
                call,
                f"`{name}.step()` runs on every micro-batch: the learning-rate schedule advances K "
                "times per optimizer step",
            )
        if not engine_steps_unguarded:
            for call in clips:
                if self._guarded(call, window):
                    continue
                what = _call_attr(call)
                self._add(
                    "AG105",
                    call,
                    f"`{what}` runs on every micro-batch: it acts on a partial (and, under no_sync, "
                    "unsynchronised) gradient; clip once on the full gradient at the boundary",
                )
        self._check_mean_of_means(window)

    # ---- F5

    def _check_mean_of_means(self, window: ast.AST) -> None:
        scope = self._enclosing(window, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.ctx.tree
        if isinstance(window, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = window
        hints = False
        for sub in ast.walk(scope):
            if isinstance(sub, ast.keyword) and sub.arg and _TOKEN_MEAN_HINTS.match(sub.arg):
                hints = True
            elif isinstance(sub, ast.Name | ast.Attribute):
                ident = sub.id if isinstance(sub, ast.Name) else sub.attr
                if ident.lower() in ("attention_mask", "ignore_index", "loss_mask", "pad_token_id"):
                    hints = True
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in (
                "attention_mask",
                "loss_mask",
            ) or (
                isinstance(sub, ast.UnaryOp)
                and isinstance(sub.op, ast.USub)
                and isinstance(sub.operand, ast.Constant)
                and sub.operand.value == 100
            ):
                hints = True
            elif (
                isinstance(sub, ast.keyword)
                and sub.arg == "reduction"
                and isinstance(sub.value, ast.Constant)
                and sub.value.value == "sum"
            ):
                return  # summed loss: the user normalises by a count themselves
        if not hints:
            return
        for sub in _walk_local(window):
            divisor: ast.AST | None = None
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div):
                divisor = sub.right
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div):
                divisor = sub.value
            if divisor is None:
                continue
            ids = list(_identifiers(divisor))
            if not any(_ACCUM_RE.search(i) for i in ids) or any(_TOKEN_NORMALISED.search(i) for i in ids):
                continue
            target = sub.target if isinstance(sub, ast.AugAssign) else sub.left
            if not any("loss" in i for i in _identifiers(target)):
                continue
            self._add(
                "AG104",
                sub,
                "the loss is divided by the number of accumulation steps, but it looks like a mean over "
                "a variable number of tokens (padding mask / ignore_index in sight): dividing means by K "
                "weights short micro-batches too much (mean of means)",
            )

    # ---- F2 / double gating (DeepSpeed)

    def _deepspeed_window(
        self, window: ast.AST, steps: list[tuple[ast.Call, str]], engine_backward: bool
    ) -> int | None:
        """Check manual accumulation around a DeepSpeed engine; return the config's GA when known."""
        if not engine_backward:
            return None
        cfg_info = self._find_ds_config()
        ga = cfg_info[0] if cfg_info else None
        if self.ctx.explicit_ds_boundary or cfg_info is None:
            return ga
        _, where = cfg_info
        engine_steps = [c for c, k in steps if k == "engine"]
        manual_gate = [c for c in engine_steps if self._guarded(c, window)]
        step_after = None
        if not engine_steps and isinstance(window, _LOOPS):
            outer = self._enclosing(window, _LOOPS)
            if outer is not None:
                for n in _walk_local(outer):
                    if (
                        isinstance(n, ast.Call)
                        and _call_attr(n) == "step"
                        and self._kind_of_receiver(_receiver(n)) == "engine"
                        and n.lineno > getattr(window, "end_lineno", window.lineno)
                    ):
                        step_after = n
                        break
        site = manual_gate[0] if manual_gate else step_after
        if site is None:
            return ga
        name = dotted(_receiver(site)) or "engine"
        if ga is None or ga <= 1:
            self._add(
                "AG109",
                site,
                f"`{name}.step()` is called once per several `backward()` calls, but the DeepSpeed "
                f"config ({where}) has gradient_accumulation_steps "
                f"{'absent' if ga is None else ga}: every backward is a boundary, so ZeRO-1/2 train "
                "on the last micro-batch only",
            )
        else:
            self._add(
                "AG110",
                site,
                f"`{name}.step()` is gated by hand while the DeepSpeed config ({where}) has "
                f"gradient_accumulation_steps {ga}: the engine counts one micro-step per step() call, "
                f"so it steps every K x {ga} micro-batches",
            )
        return ga

    def _find_ds_config(self) -> tuple[int | None, str] | None:
        """(GA, description) of the DeepSpeed config the script names, or None if none is found."""
        if self._ds_config_searched:
            return self._ds_config_cache
        self._ds_config_searched = True

        result: tuple[int | None, str] | None = None
        base = self.ctx.path.parent if self.ctx.path is not None else None
        for node in self._of(ast.Constant, ast.Dict):
            if (
                base is not None
                and isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"\.(h?json|jsonc?)$", node.value)
                and len(node.value) < 300
            ):
                for cand in (base / node.value, Path(node.value)):
                    try:
                        if not cand.is_file():
                            continue
                        cfg = dsconfig.load_config(cand)
                    except (OSError, ValueError):
                        continue
                    if not any(k in cfg for k in (*_DS_BATCH_KEYS, "zero_optimization")):
                        continue
                    ga = dsconfig.resolved_accumulation_steps(cfg)
                    line = cfg.key_lines.get(("gradient_accumulation_steps",))
                    result = (_ga_or_absent(cfg, ga), f"{node.value}" + (f":{line}" if line else ""))
                    break
            elif isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                if keys & set(_DS_BATCH_KEYS):
                    lit: dict[str, Any] = {}
                    for k, v in zip(node.keys, node.values, strict=True):
                        if isinstance(k, ast.Constant) and isinstance(k.value, str):
                            try:
                                lit[k.value] = ast.literal_eval(v)
                            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                                lit[k.value] = None
                    ga = dsconfig.resolved_accumulation_steps(lit)
                    result = (_ga_or_absent(lit, ga), f"dict literal at line {node.lineno}")
            if result is not None:
                break
        self._ds_config_cache = result
        return result

    # ---- F11

    def _check_sync_flags(self) -> None:
        for node in self._of(ast.With, ast.AsyncWith, ast.Assign):
            if isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    e = item.context_expr
                    if not (isinstance(e, ast.Call) and _call_attr(e) == "no_sync"):
                        continue
                    recv = dotted(_receiver(e))
                    if recv is None or not any(
                        isinstance(n, ast.Call) and _is_backward(n) for n in _walk_local(node)
                    ):
                        continue
                    if self._forward_inside(node, recv):
                        continue
                    fwd = self._forward_before(node, recv)
                    if fwd is None:
                        continue
                    self._add(
                        "AG106",
                        node,
                        f"`{recv}.no_sync()` wraps the backward but not the forward (line {fwd.lineno}): "
                        "DDP arms the all-reduce during the forward, so this backward still synchronises "
                        "on every micro-step",
                    )
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync":
                        recv = dotted(t.value)
                        if recv is None:
                            continue
                        fwd = self._forward_before(node, recv)
                        if fwd is None:
                            continue
                        self._add(
                            "AG106",
                            node,
                            f"`{recv}.require_backward_grad_sync` is set after the forward (line "
                            f"{fwd.lineno}) of this micro-step: DDP reads it during the forward, so the "
                            "last micro-step's backward is not all-reduced",
                        )

    def _is_forward_of(self, call: ast.Call, recv: str) -> bool:
        name = dotted(call.func)
        return name is not None and name in (recv, recv + ".forward")

    def _forward_inside(self, node: ast.AST, recv: str) -> bool:
        return any(isinstance(n, ast.Call) and self._is_forward_of(n, recv) for n in _walk_local(node))

    def _forward_before(self, node: ast.stmt, recv: str) -> ast.Call | None:
        """A forward call of ``recv`` earlier in the same loop iteration (same loop body), if any."""
        loop = self._enclosing(node, _LOOPS + _SCOPES)
        if not isinstance(loop, _LOOPS):
            return None
        header = set(_walk_local(loop.iter if isinstance(loop, ast.For | ast.AsyncFor) else loop.test))
        # the forward must feed a backward that comes after `node`
        backward_after = any(
            isinstance(b, ast.Call) and _is_backward(b) and b.lineno >= node.lineno
            for b in _walk_local(loop)
        )
        if not backward_after:
            return None
        for n in _walk_local(loop):
            if (
                isinstance(n, ast.Call)
                and n not in header
                and self._is_forward_of(n, recv)
                and (n.lineno, n.col_offset) < (node.lineno, node.col_offset)
            ):
                return n
        return None

    # ---- F10

    def _is_training_script(self) -> bool:
        """A backward and an optimizer step in the same file: a training loop, not library code.

        Library internals (tensor/pipeline parallelism, comm hooks) all-reduce
        gradients with SUM on purpose; only training scripts are checked for F10.
        """
        calls = self._of(ast.Call)
        has_backward = any(_is_backward(c) for c in calls)
        has_step = any(
            _call_attr(c) == "step" and self._kind_of_receiver(_receiver(c)) in ("optimizer", "scaler")
            for c in calls
        )
        return has_backward and has_step

    def _check_manual_all_reduce(self) -> None:
        reduces = [
            n for n in self._of(ast.Call)
            if _call_attr(n) in ("all_reduce", "all_reduce_coalesced") and n.args
        ]
        if not reduces or not self._is_training_script():
            return
        for node in reduces:
            tensor = node.args[0]
            ids = list(_identifiers(tensor))
            if not any(_GRAD_TENSOR_RE.search(i) for i in ids):
                continue
            op_node = next((k.value for k in node.keywords if k.arg == "op"), None)
            if op_node is None and len(node.args) > 1:
                op_node = node.args[1]
            op = _last(dotted(op_node)) if op_node is not None else "sum"
            if op not in ("sum", "avg", "mean", "premul_sum"):
                continue  # an op we cannot read statically (a variable): do not guess
            scope = self._enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.ctx.tree
            divided = self._divides_by_world(scope)
            if self.ctx.ddp_wrapped and not self._under_wrapper_branch(node):
                self._add(
                    "AG108",
                    node,
                    "gradients are all-reduced by hand although the model is wrapped in DDP/FSDP, which "
                    f"already averaged them: op {op.upper()} "
                    + ("then a division gives the same gradient at twice the communication"
                       if divided or op in ("avg", "mean")
                       else "multiplies the gradient by the world size"),
                )
                continue
            if op in ("avg", "mean", "premul_sum") or divided:
                continue
            self._add(
                "AG107",
                node,
                f"gradients are all-reduced with {op.upper()} and never divided by the world size: "
                "the optimizer receives W times the averaged gradient",
            )

    def _under_wrapper_branch(self, node: ast.AST) -> bool:
        """Is ``node`` under an ``if`` that switches on the wrapper (``if not use_ddp:``)?

        Then the manual reduction is the non-DDP path, not a second average.
        """
        cur = self.ctx.parents.get(node)
        while cur is not None and not isinstance(cur, _SCOPES):
            if isinstance(cur, ast.If) and any(
                re.search(r"ddp|fsdp|wrap|distributed|parallel|shard", i) for i in _identifiers(cur.test)
            ):
                return True
            cur = self.ctx.parents.get(cur)
        return False

    def _divides_by_world(self, scope: ast.AST) -> bool:
        for sub in ast.walk(scope):
            divisor: ast.AST | None = None
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div):
                divisor = sub.right
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div | ast.Mult):
                divisor = sub.value
            elif isinstance(sub, ast.Call) and _call_attr(sub) in ("div_", "div", "mul_", "true_divide_") and sub.args:
                divisor = sub.args[0]
            if divisor is not None and any(_WORLD_RE.search(i) for i in _identifiers(divisor)):
                return True
        return False


_DS_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _ga_or_absent(cfg: dict[str, Any], ga: int | None) -> int | None:
    """GA for AG109/AG110: None when absent and not derivable (treated like 1 by DeepSpeed)."""
    if "gradient_accumulation_steps" not in cfg and ga is None:
        return None
    return ga


# --------------------------------------------------------------------------- suppression & entry points


def _suppressions(source: str) -> dict[int, set[str] | None]:
    """Line -> codes suppressed there (``None`` = all), from ``# accumguard: ignore[...]`` comments."""
    out: dict[int, set[str] | None] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        comments = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        comments = [(i, line) for i, line in enumerate(source.splitlines(), 1) if "#" in line]
    for line, text in comments:
        m = _SUPPRESS_RE.search(text)
        if not m:
            continue
        if m.group(1) is None:
            out[line] = None
        else:
            codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
            prev = out.get(line, set())
            out[line] = None if prev is None else prev | codes
    return out


def _decode(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("latin-1")


_RELEVANT_TEXT = re.compile(r"backward|all_reduce")


def lint_source(
    source: str | bytes, path: str | Path | None = None, *, prefilter: bool = True
) -> list[Finding]:
    """Lint one script's source text; return findings (suppressions applied), sorted.

    ``path`` is used for messages and to find a DeepSpeed config named in the
    script (relative to the script's directory). Raises :class:`LintError` when
    the source is not valid Python. Every rule needs a ``backward`` or an
    ``all_reduce`` in the text, so files without either are only parsed
    (``prefilter=False`` analyses them anyway, which the robustness tests use).
    """
    shown = str(path) if path is not None else "<string>"
    text = _decode(source) if isinstance(source, bytes) else source
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=shown)
    except SyntaxError as exc:
        line = exc.lineno if exc.lineno and exc.lineno > 0 else 1
        col = exc.offset if exc.offset and exc.offset > 0 else 1
        raise LintError(shown, line, col, f"SyntaxError: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise LintError(shown, 1, 1, f"cannot parse: {type(exc).__name__}: {exc}") from None
    if prefilter and not _RELEVANT_TEXT.search(text):
        return []
    try:
        findings = _Linter(tree, Path(path) if path is not None else None).run()
    except RecursionError:
        raise LintError(shown, 1, 1, "file is too deeply nested to analyse") from None
    if not findings:
        return []
    sup = _suppressions(text)
    kept = []
    for f in findings:
        s = sup.get(f.line or 0, set())
        if s is None or f.code in s:
            continue
        kept.append(f.with_path(shown))
    # de-duplicate (a call can sit in two windows only through odd nesting)
    uniq = {(f.code, f.line, f.col): f for f in kept}
    return sorted(uniq.values(), key=Finding.sort_key)


def lint_file(path: str | Path, *, prefilter: bool = True) -> list[Finding]:
    """Lint one file. Raises :class:`LintError` for unreadable or invalid files."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise LintError(str(path), 1, 1, f"cannot read file: {exc.strerror or exc}") from None
    return lint_source(data, path=p, prefilter=prefilter)


def iter_python_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Expand directories to their ``*.py`` files (sorted); pass files through."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            yield from sorted(
                f for f in p.rglob("*.py") if not any(part.startswith(".") for part in f.parts)
            )
        else:
            yield p


def lint_paths(paths: Iterable[str | Path]) -> tuple[list[Finding], list[LintError]]:
    """Lint files and directories; return all findings and the files that could not be parsed."""
    findings: list[Finding] = []
    errors: list[LintError] = []
    for p in iter_python_files(paths):
        try:
            findings.extend(lint_file(p))
        except LintError as exc:
            errors.append(exc)
    return findings, errors
