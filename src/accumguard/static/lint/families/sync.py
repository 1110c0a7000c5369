"""Gradient-sync flag rules (F11): the reduction must happen on the last micro-step.

DDP decides during the *forward* whether the next backward all-reduces (the reducer
is armed in ``_post_forward`` when ``require_backward_grad_sync`` is True; the
backward only runs the armed hooks). So a flag set, or a ``no_sync()`` entered,
after the forward takes effect at the *next* forward. What matters for
correctness is only whether the last micro-step of each window was armed:

* ``require_backward_grad_sync = <on exactly at the last micro-step>`` after the
  forward: the last micro-step's forward saw the value of the one before (off), so
  the window's gradient is never all-reduced. AG106, error.
* ``require_backward_grad_sync = <off exactly at the last micro-step>`` (``not
  is_last``) after the forward: the last forward saw "on": every micro-step but the
  first all-reduces. Correct, wasteful: AG116, info.
* ``with model.no_sync(): loss.backward()`` with the forward outside: no effect,
  every micro-step all-reduces. Correct, wasteful: AG116, info.
* a value whose polarity cannot be read, set after the forward: AG106, warning.

Measured on 2 gloo ranks (torch 2.13, K = 4): the flag ``== K - 1`` after the
forward leaves the ranks' gradients apart (max error 2.4 on a toy layer), ``!= K - 1``
after the forward and ``no_sync`` around the backward alone match the averaged
large-batch gradient to 1e-7.

AG111 the flag has the wrong polarity: off on the boundary and on elsewhere
      (inverted: the last micro-batch arrives one step late), on at the first
      micro-step of the window and off at the last (``nullcontext() if micro == 0 else
      model.no_sync()``: the later micro-batches are never reduced), or switched off and
      never switched back on (no reduction at all). Syncing on every micro-step but the
      first includes the last and is right. Covers FSDP2's
      ``set_requires_gradient_sync(flag)`` (read at backward time) and DDP's
      ``require_backward_grad_sync = flag`` set before the forward.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import (
    FUNCS,
    LOOPS,
    SCOPES,
    call_attr,
    dotted,
    is_backward,
    last_part,
    position,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._syncforward import (
    forward_before,
    forward_inside,
    hands_to_forward,
    is_forward_of,
    setter_calls,
    through_parameter,
)
from accumguard.static.lint.families._synctests import (
    first_test,
    never_true,
    off_the_step,
    shown,
    step_gates,
    through_name,
    zero_based_counter,
)


def _wrapper_of(ctx: FileContext, recv: str) -> str:
    """'ddp', 'fsdp1', 'engine' or 'unknown': what ``recv`` was built by. Only DDP arms its
    reduction at the forward; FSDP1's and DeepSpeed's ``no_sync`` act at backward time."""
    if ctx.kind_of_receiver(_name_node(recv)) == "engine":
        return "engine"
    return _wrappers(ctx).get(recv, "unknown")


def _wrappers(ctx: FileContext) -> dict[str, str]:
    """Names assigned from ``DistributedDataParallel(...)`` ('ddp') or FSDP1's constructor."""
    def compute() -> dict[str, str]:
        out: dict[str, str] = {}
        for names, value in ctx.assignments():
            if isinstance(value, ast.Call):
                last = last_part(dotted(value.func))
                kind = {"distributeddataparallel": "ddp", "ddp": "ddp",
                        "fullyshardeddataparallel": "fsdp1", "fsdp": "fsdp1"}.get(last)
                if kind is not None:
                    for name in names:
                        out.setdefault(name, kind)
        return out
    return ctx._cached("wrappers", ctx.tree, compute)  # type: ignore[no-any-return]


def _name_node(dotted_name: str) -> ast.expr:
    parts = dotted_name.split(".")
    node: ast.expr = ast.Name(parts[0])
    for part in parts[1:]:
        node = ast.Attribute(node, part)
    return node


def ddp_flag_after_forward(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` (a ``require_backward_grad_sync`` assignment) runs between a forward and the
    backward of the same micro-step: it decides the *next* forward, not this one."""
    if not isinstance(node, ast.Assign):
        return False
    for t in node.targets:
        if isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync":
            recv = dotted(t.value)
            if recv is not None and forward_before(ctx, node, recv) is not None:
                return True
    return False


def _no_sync_block(ctx: FileContext, call: ast.Call) -> ast.With | ast.AsyncWith | None:
    """The ``with`` block a ``X.no_sync()`` call is active in: ``with X.no_sync():``,
    ``with (X.no_sync() if c else nullcontext()):``, or ``ctx = X.no_sync() if ...`` then
    ``with ctx:`` later in the same loop iteration (or function)."""
    cur: ast.AST | None = ctx.parents.get(call)
    while isinstance(cur, ast.expr):
        cur = ctx.parents.get(cur)
    if isinstance(cur, ast.withitem):
        block = ctx.parents.get(cur)
        return block if isinstance(block, ast.With | ast.AsyncWith) else None
    if isinstance(cur, ast.Assign) and len(cur.targets) == 1 and isinstance(cur.targets[0], ast.Name):
        name = cur.targets[0].id
        scope = ctx.enclosing(cur, LOOPS + SCOPES) or ctx.tree
        for n in ctx.local_nodes(scope):
            if (
                isinstance(n, ast.With | ast.AsyncWith)
                and position(n) > position(cur)
                and any(isinstance(i.context_expr, ast.Name) and i.context_expr.id == name for i in n.items)
            ):
                return n
    return None


def _backward_only(ctx: FileContext, call: ast.Call) -> tuple[ast.AST, ast.Call] | None:
    """(with block, forward) when ``call`` (``X.no_sync()``) spans a backward but not X's
    forward, which ran earlier in the same iteration."""
    recv = dotted(receiver(call))
    block = _no_sync_block(ctx, call)
    if recv is None or block is None:
        return None
    if not any(isinstance(n, ast.Call) and is_backward(n) for n in ctx.local_nodes(block)):
        return None
    if forward_inside(block, recv):
        return None
    fwd = forward_before(ctx, block, recv)
    return None if fwd is None else (block, fwd)


@rule("AG106", "AG116")
def sync_flag_after_forward(ctx: FileContext) -> Iterator[Finding]:
    noted: set[int] = set()
    for call in ctx.of(ast.Call):
        if call_attr(call) != "no_sync" or not isinstance(call.func, ast.Attribute):
            continue
        hit = _backward_only(ctx, call)
        if hit is None or id(hit[0]) in noted:
            continue
        block, fwd = hit
        recv = dotted(receiver(call)) or "model"
        wrapper = _wrapper_of(ctx, recv)
        if wrapper in ("fsdp1", "engine"):
            continue  # their no_sync is read at backward time: it works around the backward
        noted.add(id(block))
        hedge = "" if wrapper == "ddp" else " (if it is a DDP module)"
        yield ctx.finding(
            "AG116",
            block,
            f"`{recv}.no_sync()` wraps the backward but not the forward (line {fwd.lineno}){hedge}: "
            "DDP decides at the forward to all-reduce, so every micro-step still synchronises. "
            "The gradient is right; K-1 all-reduces per optimizer step are wasted",
        )
    reported: set[tuple[int, str]] = set()  # (loop, receiver): an if/else pair is one bug
    settings: list[tuple[ast.stmt, str, ast.AST]] = []
    for node in ctx.of(ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync" \
                    and (d := dotted(t.value)) is not None:
                settings.append((node, d, node.value))
    settings += setter_calls(ctx)
    for node, flag_recv, value in settings:
        # (a forward through a loss helper counts here: a flag set after it is read late)
        flag_fwd = forward_before(ctx, node, flag_recv, helpers=True)
        if flag_fwd is None:
            continue
        recv, fwd = flag_recv, flag_fwd
        kind = _effective(ctx, node, value)
        if kind == "unknown":
            given = through_parameter(ctx, node, value)
            if given is not value:
                kind = _effective(ctx, given, given)
        if kind == "first":
            kind = "unknown"  # one forward late: what the last micro-step sees depends on K
        key = (id(ctx.enclosing(node, LOOPS)), recv)
        if key in reported:
            continue
        if kind in ("boundary", "inverted", "unknown"):
            reported.add(key)
        at = (f"line {fwd.lineno}" if is_forward_of(fwd, recv) else
              f"in `{ast.unparse(fwd.func)}()`, called at line {fwd.lineno}")
        where = f"`{recv}.require_backward_grad_sync` is set after the forward ({at})"
        if kind == "boundary":
            yield ctx.finding(
                "AG106",
                node,
                f"{where}: DDP reads it during the forward, so it takes effect one micro-step "
                "late. The last micro-step's forward saw the previous micro-step's False: the "
                "window's gradient is never all-reduced and the ranks drift apart",
            )
        elif kind == "inverted":
            yield ctx.finding(
                "AG116",
                node,
                f"{where}: DDP reads it during the forward, so each value takes effect one "
                "micro-step late; with this polarity every micro-step but the first of a "
                "window all-reduces, including the last. The gradient is right; the "
                "all-reduces of the other micro-steps are wasted",
                fix="set `require_backward_grad_sync = (micro == K - 1)` before the forward "
                "to all-reduce once per optimizer step",
            )
        elif kind == "unknown":
            yield replace(
                ctx.finding(
                    "AG106",
                    node,
                    f"{where}: DDP reads it during the forward, so this value decides the "
                    "*next* micro-step. Whether the last micro-step of a window is all-reduced "
                    "cannot be read from the value; set the flag before the forward",
                ),
                severity=Severity.WARNING,
                confidence=Confidence.MEDIUM,
            )


def _sync_settings(ctx: FileContext) -> list[tuple[ast.AST, ast.AST, str]]:
    """(statement or call, value expression, receiver) of every sync-flag setting."""
    out: list[tuple[ast.AST, ast.AST, str]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) == "set_requires_gradient_sync" and isinstance(call.func, ast.Attribute):
            value = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "requires_gradient_sync"), None
            )
            if value is not None:
                out.append((call, value, dotted(call.func.value) or "model"))
        elif call_attr(call) == "no_backward_sync" and call.args:
            # Lightning Fabric: `fabric.no_backward_sync(model, enabled=E)` skips the sync
            # while E holds, i.e. the sync flag is `not E`
            enabled = call.args[1] if len(call.args) > 1 else next(
                (k.value for k in call.keywords if k.arg == "enabled"), None)
            if isinstance(enabled, ast.UnaryOp) and isinstance(enabled.op, ast.Not):
                out.append((call, enabled.operand, dotted(call.args[0]) or "model"))
            elif enabled is not None:
                flag = ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=enabled), enabled)
                ctx.parents[flag] = call
                out.append((call, flag, dotted(call.args[0]) or "model"))
    for node in ctx.of(ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync":
                out.append((node, node.value, dotted(t.value) or "model"))
    return out


def _loop_targets(ctx: FileContext, node: ast.AST) -> set[str]:
    """The names the ``for`` loops around ``node`` bind."""
    out: set[str] = set()
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, SCOPES):
        if isinstance(cur, ast.For | ast.AsyncFor):
            out |= {n.id for n in ast.walk(cur.target) if isinstance(n, ast.Name)}
        cur = ctx.parents.get(cur)
    return out


def _first_of_stepless_loop(ctx: FileContext, test: ast.AST) -> bool:
    """``test`` (or the one value its name is assigned) is true at the first iteration only
    of the loop counting from 0 (``micro % K == 0``, ``micro == 0``), and that loop steps no
    optimizer inside: the step comes after its last iteration, which the test misses."""
    scope = ctx.enclosing(test, FUNCS) or ctx.tree
    value = through_name(ctx, scope, test)
    if first_test(ctx, value) is not True:
        return False
    counters = {x.id for x in ast.walk(value) if isinstance(x, ast.Name)
                and zero_based_counter(ctx, x) is not None}
    loop = ctx.parents.get(test)
    while loop is not None and not isinstance(loop, SCOPES):
        if isinstance(loop, ast.For | ast.AsyncFor):
            target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) and loop.target.elts \
                else loop.target
            if isinstance(target, ast.Name) and target.id in counters:
                return not any(isinstance(c, ast.Call) and call_attr(c) == "step"
                               for c in ast.walk(loop))
        loop = ctx.parents.get(loop)
    return False


def _read(ctx: FileContext, node: ast.AST, value: ast.AST) -> ast.AST:
    """``value`` with a flag name read as the one value its function gives it, under a
    ``not`` too (``not is_accumulating`` with ``is_accumulating = micro % K != 0``)."""
    if call_attr(node) != "no_backward_sync" if isinstance(node, ast.Call) else True:
        return value  # (other flags are read as written)
    scope = ctx.enclosing(node, FUNCS) or ctx.tree
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not) and isinstance(value.operand, ast.Name):
        inner = through_name(ctx, scope, value.operand)
        return value if inner is value.operand or not isinstance(inner, ast.expr) else ast.copy_location(
            ast.UnaryOp(op=ast.Not(), operand=inner), value)
    return through_name(ctx, scope, value) if isinstance(value, ast.Name) else value


def _effective(ctx: FileContext, node: ast.AST, value: ast.AST) -> str:
    """'boundary' (on exactly at the boundary), 'inverted', 'first' (on at the first micro-step
    of the window, off at the last), 'off', 'on' or 'unknown'."""
    if never_true(ctx, value):
        return "never"
    pol = ctx.boundary_polarity(value) if not isinstance(value, ast.Constant) else None
    if pol is not None:
        return "boundary" if pol else "inverted"
    if not isinstance(value, ast.Constant) and (first := first_test(ctx, _read(ctx, node, value))) is not None:
        return "first" if first else "on"
    if not (isinstance(value, ast.Constant) and isinstance(value.value, bool)):
        return "unknown"
    on = value.value
    # the first enclosing `if` that tests a boundary decides when this constant applies
    child, cur = node, ctx.parents.get(node)
    while cur is not None and not isinstance(cur, SCOPES):
        if isinstance(cur, ast.If) and child is not cur.test:
            p = ctx.boundary_polarity(cur.test)
            if p is not None:
                at_boundary = p if child in cur.body else not p
                return "boundary" if on == at_boundary else "inverted"
            first = first_test(ctx, cur.test)
            if first is not None:
                # `if micro == 0: flag = True`: this constant applies at the first micro-step
                # only, or at the others (the last included)
                if (child in cur.body) == first:
                    return "first" if on else "on"
                return "on" if on else "off"
        child, cur = cur, ctx.parents.get(cur)
    return "on" if on else "off"


def _gates_the_step(ctx: FileContext, node: ast.AST, test: ast.AST) -> bool:
    """The same test (or the flag it is read from) gates the optimizer step: the sync falls
    on the stepping micro-step, wherever that is."""
    scope = ctx.enclosing(node, FUNCS) or ctx.tree
    read = through_name(ctx, scope, test)
    value = ast.dump(read)
    names = {d for n in walk_all(read) if isinstance(n, ast.Name | ast.Attribute)
             and (d := dotted(n)) is not None}
    bumps = [n.lineno for n in ctx.local_nodes(scope) if isinstance(n, ast.AugAssign)
             and dotted(n.target) in names]  # (`self.micro_step += 1` too)
    # (a counter incremented between the two tests: the same text, another micro-step)
    # (an `if` returning the sync context itself is no step's gate: `if micro % K != 0:
    # return model.no_sync()` ends the helper early, the step is elsewhere)
    return any(ast.dump(through_name(ctx, scope, g.test)) == value
               and not any(node.lineno < b < g.lineno for b in bumps)  # type: ignore[attr-defined]
               and not any(node is x for st in g.body for x in ast.walk(st))
               for g in step_gates(ctx, scope))


def _plus_one_after_bump(ctx: FileContext, test: ast.AST, at: ast.AST) -> bool:
    """``test`` is ``(c + 1) % K == 0`` where ``c`` (a name or ``self.c``, set to 0) is
    incremented by 1 before ``at`` in the same function: ``c`` already counts this
    micro-step from 1, so the test holds at the window's K-1-th micro-step, not its last."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0):
        return False
    mod = test.left
    if not (isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod)
            and isinstance(mod.left, ast.BinOp) and isinstance(mod.left.op, ast.Add)
            and isinstance(mod.left.right, ast.Constant) and mod.left.right.value == 1):
        return False
    counter = dotted(mod.left.left)
    fn = ctx.enclosing(at, FUNCS)
    if counter is None or fn is None:
        return False
    line = getattr(at, "lineno", 0)
    bumped = any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and dotted(n.target) == counter
                 and isinstance(n.value, ast.Constant) and n.value.value == 1 and n.lineno < line
                 for n in ast.walk(fn))
    zeroed = any(isinstance(n, ast.Assign) and any(dotted(t) == counter for t in n.targets)
                 and isinstance(n.value, ast.Constant) and n.value.value == 0 for n in ctx.of(ast.Assign))
    return bumped and zeroed


def _no_sync_polarity(ctx: FileContext, call: ast.Call) -> tuple[str, ast.AST | None]:
    """('inverted', test) when ``model.no_sync()`` is chosen exactly at the boundary (``no_sync()
    if is_last else nullcontext()``, or ``with no_sync():`` under ``if is_last:``); ('first', test)
    when it is chosen on every micro-step but the first (``nullcontext() if micro == 0 else
    model.no_sync()``): the window syncs on its first micro-step, not on its last."""
    child: ast.AST = call
    cur = ctx.parents.get(call)
    while cur is not None and not isinstance(cur, SCOPES):
        if isinstance(cur, ast.IfExp | ast.If) and child is not cur.test:
            in_true_branch = child is cur.body or (isinstance(cur, ast.If) and child in cur.body)
            if _first_of_stepless_loop(ctx, cur.test):
                # synchronised where the test holds (the loop's first iteration) only
                return ("first" if not in_true_branch else "ok"), cur.test
            # a flag read through its one assignment (`sync_now = micro % K == 0`)
            test = through_name(ctx, ctx.enclosing(cur, FUNCS) or ctx.tree, cur.test)
            if _plus_one_after_bump(ctx, test, cur):
                # `(c + 1) % K == 0` with c already counting this micro-step: true at the
                # window's K-1-th micro-step; synchronised there when no_sync is the other branch
                return ("early" if not in_true_branch else "ok"), cur.test
            p = ctx.boundary_polarity(test)
            if p is not None:
                active_at_boundary = p if in_true_branch else not p
                return ("inverted" if active_at_boundary else "ok"), cur.test
            first = first_test(ctx, test)
            if first is not None:
                # active on every micro-step but the first: the window syncs on its first only
                return ("first" if in_true_branch != first else "ok"), cur.test
        child, cur = cur, ctx.parents.get(cur)
    return "unknown", None


@rule("AG111")
def sync_flag_polarity(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.windows():
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) != "no_sync" or not isinstance(call.func, ast.Attribute):
            continue
        polarity, test = _no_sync_polarity(ctx, call)
        if polarity == "early":
            recv = dotted(call.func.value) or "model"
            yield ctx.finding(
                "AG111",
                call,
                f"`{recv}.no_sync()` is skipped when `{ast.unparse(test) if test is not None else ''}`, "
                "but the counter it tests was already incremented for this micro-step (it counts "
                "from 1 here): the test holds at the window's second-to-last micro-step, which is "
                "all-reduced, and the last one runs under no_sync, so its gradient stays on its "
                "own rank; expected `counter % K == 0` after the increment",
            )
            continue
        if polarity not in ("inverted", "first"):
            continue
        if polarity == "first" and test is not None and _gates_the_step(ctx, call, test):
            continue  # synchronised on the micro-step that steps: its windows are AG115's
        recv = dotted(call.func.value) or "model"
        if _backward_only(ctx, call) is not None and _wrapper_of(ctx, recv) not in ("fsdp1", "engine"):
            continue  # DDP ignores a no_sync entered after the forward: no effect (AG116)
        if polarity == "inverted":
            yield ctx.finding(
                "AG111",
                call,
                f"`{recv}.no_sync()` is chosen on the boundary micro-step and not on the others: "
                "the gradients are all-reduced on every micro-step but the last, whose "
                "contribution stays unsynchronised",
            )
        else:
            yield ctx.finding(
                "AG111",
                call,
                f"`{recv}.no_sync()` is chosen on every micro-step but the first (by `{shown(ctx, ctx.enclosing(call, FUNCS) or ctx.tree, test) if test is not None else ast.unparse(call)}`): "
                "the first micro-step of the window is all-reduced and the last is not, so "
                "the later micro-batches' gradients stay on their own rank and the ranks step on "
                "different gradients; expected the sync on the last micro-step only "
                f"(`nullcontext() if micro == K - 1 else {recv}.no_sync()`)",
            )
    settings = _sync_settings(ctx)
    if not settings:
        return
    offsets = {node: off_the_step(ctx, node, value) for node, value, _ in settings}
    values = {node: value for node, value, _ in settings}
    kinds = [
        (node, recv, "after_forward" if ddp_flag_after_forward(ctx, node)
         else "offset" if offsets[node] else _effective(ctx, node, value))
        for node, value, recv in settings
    ]
    re_enabled = {recv for _, recv, k in kinds if k in ("boundary", "on", "unknown", "after_forward", "first")}
    # a flag turned on through a loop's variable (`for u in units: u.set_requires_gradient_
    # sync(True, recurse=False)`) may turn on any module: which ones is AG181's question
    if any(recv in _loop_targets(ctx, node) for node, recv, _ in kinds
           if recv in re_enabled):
        re_enabled = {recv for _, recv, _ in kinds}
    for node, recv, kind in kinds:
        what = (
            f"`{ast.unparse(node.func)}({recv}, enabled=...)` (its sync is `not enabled`)"
            if isinstance(node, ast.Call) and call_attr(node) == "no_backward_sync"
            else f"`{recv}.set_requires_gradient_sync(...)`" if isinstance(node, ast.Call)
            else f"`{recv}.require_backward_grad_sync`"
        )
        if kind == "offset" and (tests := offsets.get(node)) is not None:
            yield ctx.finding(
                "AG111",
                node,
                f"{what} turns synchronisation on when `{tests[0]}`, but the optimizer steps "
                f"when `{tests[1]}`: another micro-step of the window. The stepping micro-step's "
                "gradient is not synchronised (the ranks step on different gradients), and what "
                "was synchronised earlier is only part of the window; expected the sync flag to "
                "be the step's own test",
            )
        elif kind == "inverted":
            yield ctx.finding(
                "AG111",
                node,
                f"{what} is inverted: gradients are synchronised off the boundary and not on it, "
                "so the last micro-batches of a window reach the optimizer one step late",
            )
        elif kind == "first" and not _gates_the_step(ctx, node, values[node]):
            # (synchronised on the micro-step that steps: its windows are AG115's)
            yield ctx.finding(
                "AG111",
                node,
                f"{what} turns synchronisation on at the first micro-step of the window and off at "
                "the last: the later micro-batches' gradients are never synchronised and the ranks "
                "step on different gradients; expected it on the last micro-step only "
                "(`micro == K - 1`)",
            )
        elif kind == "never":
            yield ctx.finding(
                "AG111",
                node,
                f"{what} is set to `{ast.unparse(values[node])}`"
                ", which the loop's counter never reaches (`range` stops one short): no micro-step "
                "is synchronised, each rank steps on its own gradient; expected the last "
                "micro-step's test (`micro == K - 1`)",
            )
        elif kind == "off" and recv not in re_enabled:
            yield ctx.finding(
                "AG111",
                node,
                f"{what} switches gradient synchronisation off and nothing switches it back on: "
                "no reduction ever happens, each rank steps on its own gradient",
            )


@rule("AG111")
def forward_always_under_no_sync(ctx: FileContext) -> Iterator[Finding]:
    """``with accelerator.no_sync(model):`` (or ``model.no_sync()``) entered on every
    micro-step around the forward, the boundary's backward written outside the block: DDP
    decided at that forward not to reduce, so no backward of the window all-reduces and each
    rank steps on its own gradient. Silent when the file forces the reduction after the
    forward (Accelerate's ``trigger_sync_in_backward``, the flag set by hand: AG106's)."""
    forced = {"trigger_sync_in_backward", "prepare_for_backward"}
    if any((call_attr(c) or "") in forced for c in ctx.of(ast.Call)) or any(
            isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync"
            for a in ctx.of(ast.Assign) for t in a.targets):
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) != "no_sync":
            continue
        block = _no_sync_block(ctx, call)
        if block is None or not any(item.context_expr is call for item in block.items):
            continue  # (a no_sync chosen by a condition: AG111's polarity rule)
        recv = dotted(call.args[0]) if call.args else dotted(receiver(call))
        loop = ctx.enclosing(block, LOOPS + SCOPES)
        if recv is None or not isinstance(loop, LOOPS):
            continue
        cur = ctx.parents.get(block)
        while cur is not None and cur is not loop and not isinstance(cur, ast.If | ast.Try):
            cur = ctx.parents.get(cur)
        if cur is not loop:
            continue  # entered only on some micro-steps
        inside = set(walk_all(block))
        if not any(isinstance(n, ast.Call) and (is_forward_of(n, recv)
                                                or hands_to_forward(ctx, n, recv))
                   for n in inside):
            continue
        after = [b for b in walk_all(loop) if isinstance(b, ast.Call) and is_backward(b)
                 and b not in inside and position(b) > position(block)]
        if not after:
            continue
        last = after[0].end_lineno or after[0].lineno
        if any(isinstance(n, ast.Call) and n not in inside and position(block) < position(n)
               and n.lineno <= last and (is_forward_of(n, recv) or hands_to_forward(ctx, n, recv))
               for n in walk_all(loop)):
            continue  # the boundary's own forward runs outside the block too: it syncs
        yield ctx.finding(
            "AG111",
            after[0],
            f"`{ast.unparse(call)}` is entered on every micro-step around `{recv}`'s forward, "
            f"and the boundary's backward (line {after[0].lineno}) runs outside it: DDP decides "
            "at the forward whether the next backward all-reduces, so no backward of the window "
            "reduces the gradient and each rank steps on its own",
            fix="run the last micro-step's forward outside no_sync (`with accelerator.no_sync(model) "
                "if not boundary else nullcontext():` around forward and backward), or force the "
                "reduction with `accelerator.trigger_sync_in_backward(model)` around the last "
                "backward; `accelerator.accumulate(model)` does it for you",
        )
