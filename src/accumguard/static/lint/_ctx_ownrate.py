"""Optimizers of a window that step at their own rate (a GAN's discriminator, an
actor-critic's critic): a mixin of the lint file context, under
:class:`._ctx_windows.WindowQueries`, which classifies each window's calls with it."""

from __future__ import annotations

import ast
from typing import Protocol

from accumguard.static.lint._ast import (
    ACCUM_RE,
    call_attr,
    dotted,
    identifiers,
    is_backward,
    position,
    receiver,
    walk_local,
)
from accumguard.static.lint._ctx_reach import ReachFacts


class _WindowCalls(Protocol):
    """What is read of a window's classified calls (:class:`._ctx_windows.WindowFacts`)."""

    steps: list[tuple[ast.Call, str]]
    zero_grads: list[tuple[ast.Call, str]]
    unguarded_optimizer_steps: list[ast.Call]

__all__ = ["OwnRateQueries", "stepped_name"]


def stepped_name(call: ast.Call) -> str | None:
    """The optimizer a step call steps: ``opt.step()`` -> ``opt``, ``scaler.step(opt)`` ->
    ``opt``."""
    recv = dotted(receiver(call))
    if call.args and recv is not None and "scaler" in recv.lower():
        return dotted(call.args[0])
    return recv



class OwnRateQueries(ReachFacts):
    """Which of a window's optimizers step at their own rate, and the modules they own."""

    def _own_rate_optimizers(self, window: ast.AST, f: _WindowCalls) -> set[str]:
        """Optimizers of ``window`` that step on every micro-step and clear their own
        gradients on every micro-step (``opt_d.zero_grad()``, or ``net_d.zero_grad()`` on
        the module ``opt_d`` was built on), while another optimizer of the window steps
        only at the boundary: each has its own window of one micro-step (a GAN's
        discriminator, an actor-critic's critic). With the names of their modules."""
        boundary = {
            stepped_name(c) for c, k in f.steps
            if k == "optimizer" and self.guarded(c, window)
        } - {None}
        if not boundary:
            return set()
        cleared = {
            dotted(receiver(z)) for z, _ in f.zero_grads if not self.guarded(z, window)
        } - {None}
        # the names of the boundary tests (``(i + 1) % accum == 0``): a loss divided by one
        # of them was meant to accumulate
        k_names: set[str] = set()
        for c, k in f.steps:
            if k == "optimizer" and stepped_name(c) in boundary:
                cur = self.parents.get(c)
                while cur is not None and cur is not window:
                    if isinstance(cur, ast.If) and self.is_boundary_test(cur.test):
                        k_names |= set(identifiers(cur.test)) | self._returned_names(cur.test)
                    cur = self.parents.get(cur)
        own: set[str] = set()
        for call in f.unguarded_optimizer_steps:
            name = stepped_name(call)
            if name is None or name in boundary:
                continue
            modules = self._built_on(name)
            if (name in cleared or modules & cleared) and not self._loss_divided_by_k(
                    window, call, k_names):
                own |= {name, *modules}
        return own

    def _returned_names(self, test: ast.AST) -> set[str]:
        """For a test that calls a function of the file (``self.window_done(i)``), the
        identifiers of that function's one ``return`` (``(i + 1) % K == 0``: K's name)."""
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name | ast.Attribute)):
            return set()
        name = test.func.id if isinstance(test.func, ast.Name) else test.func.attr
        defs = self.defs_by_name().get(name, [])
        rets = [r.value for r in walk_local(defs[0]) if isinstance(r, ast.Return)] \
            if len(defs) == 1 else []
        return set(identifiers(rets[0])) if len(rets) == 1 and rets[0] is not None else set()

    def _loss_divided_by_k(self, window: ast.AST, step: ast.Call, k_names: set[str]) -> bool:
        """The last backward before ``step`` in the window ran on a loss divided by K (a name
        of the boundary test, or one that says accumulation): that optimizer was meant to
        accumulate, and stepping it every micro-step is F1. Also when it cannot be told."""
        nodes = list(self.local_nodes(window))
        before = [n for n in nodes if isinstance(n, ast.Call) and is_backward(n)
                  and position(n) < position(step)]
        if not before:
            return True
        bw = max(before, key=position)
        recv = receiver(bw)
        if call_attr(bw) == "manual_backward" or self.kind_of_receiver(recv) == "engine" or \
                self.is_accelerator(recv):
            expr: ast.AST | None = bw.args[0] if bw.args else None  # x.backward(loss)
        else:
            expr = recv  # loss.backward()
        if expr is None:
            return True

        def divides(e: ast.AST) -> bool:
            for sub in ast.walk(e):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div | ast.FloorDiv):
                    ids = set(identifiers(sub.right))
                    if ids & k_names or any(ACCUM_RE.search(i) for i in ids):
                        return True
            return False

        if divides(expr):
            return True
        loss = dotted(expr)
        if loss is None:
            return False
        for n in nodes:
            if position(n) >= position(bw):
                continue
            if isinstance(n, ast.Assign) and loss in {dotted(t) for t in n.targets} \
                    and divides(n.value):
                return True
            if isinstance(n, ast.AugAssign) and dotted(n.target) == loss and isinstance(
                    n.op, ast.Div | ast.FloorDiv) and divides(
                        ast.BinOp(ast.Name("x"), ast.Div(), n.value)):
                return True
        return False

    def _built_on(self, opt_name: str) -> set[str]:
        """The modules whose ``.parameters()`` the optimizer ``opt_name`` was built on
        (``opt_d = Adam(net_d.parameters())``), where the file assigns it."""
        built: dict[str, set[str]] = self._cached("built_on", self.tree, self._all_built_on)
        return built.get(opt_name, set())

    def _all_built_on(self) -> dict[str, set[str]]:
        """Every assigned name -> the modules whose parameters its constructor call reads;
        one pass over the file (per optimizer and window it made lint quadratic)."""
        out: dict[str, set[str]] = {}
        for n in self.of(ast.Assign):
            if not isinstance(n.value, ast.Call):
                continue
            mods = {m for sub in ast.walk(n.value)
                    if isinstance(sub, ast.Call)
                    and call_attr(sub) in ("parameters", "named_parameters")
                    and (m := dotted(receiver(sub))) is not None}
            for t in n.targets:
                name = dotted(t)
                if name is not None:
                    out.setdefault(name, set()).update(mods)
        return out
