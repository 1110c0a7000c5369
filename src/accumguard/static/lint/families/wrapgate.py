"""AG168 (F14): an optimizer wrapper that accumulates by itself, stepped only at the loop's
boundary.

A class of the file wraps the optimizer and steps it only on every N-th call of its own
``step()`` (``self.calls % self.accum_steps == 0``, as optax's MultiSteps and many
in-house trainers do): it is meant to be called after every backward. A loop that also
guards the call with its own boundary test (``if (i + 1) % K == 0: wrapper.step()``) gates
twice: the wrapped optimizer steps once every N windows, on N x K micro-batches, with the
loss still normalised for K. Reported when the wrapper's N is an integer above 1 the file
spells (the constructor's argument, or the parameter's default); a wrapper built with
N = 1 is a pass-through and the loop's gate alone is right.

AG194 (F14): a method of a trainer class, called once per window by a loop whose inner loop
runs the window's micro-batches (each with its backward), steps the optimizer only when a
counter of windows it increments is a multiple of the accumulation count
(``self.windows_seen += 1; if self.windows_seen % self.config.grad_accum == 0: step``): the
loop groups K micro-batches per window and the hook steps every K windows, K x K micro-batches
per step with the loss normalised for K.

AG376 (F14): the same twice-gating with the window in a helper: a loop calls a function or
method of the file that runs a whole window itself (its loop over K micro-batches runs the
backwards: ``def train_step(self, micro_batches): for x in micro_batches: ...backward()``, fed
``[next(it) for _ in range(K)]``), and steps the optimizer only when its own counter is a
multiple of K (``if (self.iter_num + 1) % K == 0: self.optimizer_step()``): each step sums K
windows, K x K micro-batches normalised for K, and training makes K times fewer steps.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._rule import rule

__all__ = ["window_helper_gated_again", "window_hook_gated_again", "wrapper_gated_twice"]


def _self_attrs(expr: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _modulo_gate(expr: ast.AST) -> str | None:
    """``self.a % self.n == 0`` (either order of the comparison): the period's attribute."""
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1
            and isinstance(expr.ops[0], ast.Eq)):
        return None
    sides = [expr.left, expr.comparators[0]]
    zero = [s for s in sides if isinstance(s, ast.Constant) and s.value == 0]
    mod = [s for s in sides if isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mod)]
    if not zero or not mod:
        return None
    right = mod[0].right
    if isinstance(right, ast.Attribute) and isinstance(right.value, ast.Name) \
            and right.value.id == "self" and _self_attrs(mod[0].left):
        return right.attr
    return None


def _gating_period(step: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The attribute of ``self`` that the wrapper's ``step`` counts its calls modulo, when
    an inner optimizer's ``.step()`` runs only under that test (directly, or through a flag
    assigned from it)."""
    flags: dict[str, str] = {}
    for n in ast.walk(step):
        if isinstance(n, ast.Assign) and (period := _modulo_gate(n.value)):
            for t in n.targets:
                if isinstance(t, ast.Attribute | ast.Name):
                    flags[ast.unparse(t)] = period
    for n in ast.walk(step):
        if not isinstance(n, ast.If):
            continue
        period = _modulo_gate(n.test) or flags.get(ast.unparse(n.test))
        if period and any(isinstance(c, ast.Call) and call_attr(c) == "step"
                          and (dotted(receiver(c)) or "").startswith("self.")
                          for b in n.body for c in ast.walk(b)):
            return period
    return None


def _period_values(ctx: FileContext, cls: ast.ClassDef, period: str) -> list[int | None]:
    """The period each construction of ``cls`` in the file gives (None: not spelled)."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None)
    if init is None:
        return []
    param = next((ast.unparse(n.value) for n in ast.walk(init) if isinstance(n, ast.Assign)
                  and any(ast.unparse(t) == f"self.{period}" for t in n.targets)
                  and isinstance(n.value, ast.Name)), None)
    if param is None:
        return []
    names = [a.arg for a in init.args.args[1:]]
    defaults = dict(zip(names[len(names) - len(init.args.defaults):], init.args.defaults,
                        strict=True))
    out: list[int | None] = []
    for call in ctx.of(ast.Call):
        if not (isinstance(call.func, ast.Name) and call.func.id == cls.name):
            continue
        given = next((k.value for k in call.keywords if k.arg == param), None)
        if given is None and param in names and names.index(param) < len(call.args):
            given = call.args[names.index(param)]
        out.append(ctx.int_value(given if given is not None else defaults.get(param)))
    return out


@rule("AG168")
def wrapper_gated_twice(ctx: FileContext) -> Iterator[Finding]:
    wrappers = ctx.wrapper_instances()
    if not wrappers:
        return
    said: set[str] = set()
    for window in ctx.windows():
        if not ctx.window_facts(window).accumulating:
            continue
        for call in ctx.local_nodes(window):
            if not (isinstance(call, ast.Call) and call_attr(call) == "step"):
                continue
            name = dotted(receiver(call))
            cls = wrappers.get(name or "")
            if cls is None or name in said or not ctx.guarded(call, window):
                continue
            step = next((f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                         and f.name == "step"), None)
            period = _gating_period(step) if step is not None else None
            values = _period_values(ctx, cls, period) if period else []
            if not values or any(v is None or v < 2 for v in values):
                continue
            said.add(name or "")
            n = values[0] if len(set(values)) == 1 else "N"
            yield ctx.finding(
                "AG168",
                call,
                f"`{name}.step()` runs only at this loop's boundary, but `{cls.name}.step` "
                f"steps its optimizer itself only on every {n}-th call (`self.{period}`): gated "
                f"twice, the optimizer steps once every {n} windows, on {n} windows' "
                "micro-batches, with the loss still normalised for one",
            )


def _runs_backward(ctx: FileContext, body: list[ast.stmt], depth: int = 2) -> bool:
    """``body`` calls a backward, directly or in a method of the file it calls (``self.x()``)."""
    defs = ctx.functions_by_name()
    for stmt in body:
        for n in ast.walk(stmt):
            if not isinstance(n, ast.Call):
                continue
            if call_attr(n) in ("backward", "manual_backward"):
                return True
            if depth and isinstance(n.func, ast.Attribute) and dotted(n.func.value) == "self" \
                    and any(_runs_backward(ctx, f.body, depth - 1) for f in defs.get(n.func.attr, [])):
                return True
    return False


@rule("AG194")
def window_hook_gated_again(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(ast.FunctionDef):
        if not isinstance(fn, ast.FunctionDef) or ctx.enclosing(fn, (ast.ClassDef,)) is None:
            continue
        bumps = {dotted(n.target) for n in fn.body if isinstance(n, ast.AugAssign)
                 and isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant) and n.value.value == 1}
        for gate in fn.body:
            if not isinstance(gate, ast.If):
                continue
            t = gate.test
            mod = t.left if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) \
                and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value == 0 else None
            if not (isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod)
                    and dotted(mod.left) in bumps and ctx.mentions_accum(mod.right)):
                continue
            if not any(isinstance(n, ast.Call) and (call_attr(n) or "").endswith("step")
                       for st in gate.body for n in ast.walk(st)):
                continue
            # every call of this method sits in a loop whose inner loop runs the backwards
            sites = [c for c in ctx.of(ast.Call) if isinstance(c, ast.Call)
                     and isinstance(c.func, ast.Attribute) and c.func.attr == fn.name
                     and dotted(c.func.value) == "self"]
            if not sites:
                continue
            ok = True
            for c in sites:
                loop = ctx.enclosing(c, (ast.For,))
                inner = [n for n in ast.walk(loop) if isinstance(n, ast.For) and n is not loop] \
                    if isinstance(loop, ast.For) else []
                if not inner or not any(_runs_backward(ctx, i.body) for i in inner) \
                        or ctx.enclosing(c, (ast.For,)) is not loop \
                        or any(c in ast.walk(i) for i in inner):
                    ok = False
            if not ok:
                continue
            yield ctx.finding(
                "AG194",
                gate,
                f"`{fn.name}()` steps only when `{ast.unparse(t)}`, and it is called once per "
                f"window by a loop whose inner loop already runs the window's micro-batches "
                f"(line {sites[0].lineno}): the step is gated twice, so the optimizer steps "
                "once every K windows, on the K x K micro-batches since its last step",
                fix=f"step in `{fn.name}()` on every call (the loop's windows are the "
                    "accumulation), or drop the loop's grouping and keep the counter",
            )
            return


def _k_items(ctx: FileContext, expr: ast.AST | None) -> bool:
    """``expr`` holds K items: ``range(K)``, or a comprehension over ``range(K)``, K a name of
    the accumulation count (``[next(it) for _ in range(cfg.grad_accum)]``)."""
    if isinstance(expr, ast.ListComp | ast.GeneratorExp) and len(expr.generators) == 1:
        expr = expr.generators[0].iter
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "range"
            and len(expr.args) == 1 and ctx.mentions_accum(expr.args[0]))


def _given(ctx: FileContext, site: ast.Call, fn: ast.FunctionDef | ast.AsyncFunctionDef,
           param: str) -> ast.AST | None:
    """What ``site`` passes for ``param`` of ``fn``, a name followed to its one value."""
    given = bound_argument(fn, site, param)
    if isinstance(given, ast.Name):
        values = ctx.assigned_in(ctx.scope_of(site)).get(given.id, [])
        given = values[0] if len(values) == 1 else given
    return given


def _steps_optimizer(ctx: FileContext, body: list[ast.stmt]) -> bool:
    """``body`` steps an optimizer, directly or in a function of the file it calls."""
    for stmt in body:
        for n in ast.walk(stmt):
            if not isinstance(n, ast.Call):
                continue
            if call_attr(n) == "step" and ctx.kind_of_receiver(receiver(n)) == "optimizer":
                return True
            fn = ctx.callee_of(n)
            if fn is not None and any(isinstance(c, ast.Call) and call_attr(c) == "step"
                                      and ctx.kind_of_receiver(receiver(c)) == "optimizer"
                                      for c in ast.walk(fn)):
                return True
    return False


def _mod_k_gate(ctx: FileContext, test: ast.AST) -> bool:
    """``(n + 1) % K == 0`` or ``n % K == 0``, K a name of the accumulation count."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    mod = [x for x in sides if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mod)]
    return (bool(mod) and any(isinstance(x, ast.Constant) and x.value == 0 for x in sides)
            and ctx.mentions_accum(mod[0].right))


@rule("AG376")
def window_helper_gated_again(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        if not isinstance(window, ast.For) or ctx.window_facts(window).steps:
            continue
        fn = ctx.enclosing(window, (ast.FunctionDef, ast.AsyncFunctionDef))
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for site in ctx.call_sites(fn):
            loop = ctx.enclosing(site, (ast.For, ast.While))
            if loop is None or ctx.enclosing(site, (ast.FunctionDef, ast.AsyncFunctionDef)) is fn:
                continue
            iterated = window.iter
            if isinstance(iterated, ast.Call) and dotted(iterated.func) == "enumerate" and iterated.args:
                iterated = iterated.args[0]
            items = iterated if _k_items(ctx, iterated) else (
                _given(ctx, site, fn, iterated.id) if isinstance(iterated, ast.Name) else None)
            if items is None or not _k_items(ctx, items):
                continue
            gates = [n for n in ctx.local_nodes(loop) if isinstance(n, ast.If)
                     and ctx.enclosing(n, (ast.For, ast.While)) is loop
                     and _mod_k_gate(ctx, n.test) and _steps_optimizer(ctx, n.body)
                     and site not in {c for b in n.body for c in ast.walk(b)}]
            if not gates:
                continue
            yield ctx.finding(
                "AG376",
                gates[0],
                f"`{fn.name}()` (line {site.lineno}) already runs a whole window: its loop at line "
                f"{window.lineno} runs the backward of each of K micro-batches "
                f"(`{ast.unparse(items)}`), and this loop still steps the optimizer only when "
                f"`{ast.unparse(gates[0].test)}`: the step is gated twice, so each step sums K windows "
                "(K x K micro-batches) and training makes K times fewer steps",
                fix=f"step after every call of `{fn.name}()` (its window is the accumulation), or "
                    "pass it one micro-batch per call and keep the loop's counter",
            )
            return
