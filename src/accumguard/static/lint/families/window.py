"""Window rules: what must happen only at the boundary but runs on every micro-step.

AG101 (F1) optimizer step, AG102 (F3) zero_grad, AG105 (F8) clipping. When the
optimizer itself steps every micro-step (AG101) the zero_grad and clipping next
to it are consistent with that step: one root cause, one finding.

AG115 (F13) the step's modulo guard is off by one: ``if i % K == 0:`` after the
backward with ``i`` counting micro-batches from 0 steps after micro-batch 0, so the
first window has 1 micro-batch (K + 1 with ``i > 0 and``). The first firing is
computed from the counter's start (``enumerate``/``range`` start, or ``i = <int>``
before the loop and whether ``i += 1`` comes before the test), the guard's offset
(``(i + 1) % K``, ``i % K == K - 1``) and whether the step comes before or after
the backward; a right window has K micro-batches (or the first step runs before
any backward and is a no-op). Error when all of it is in sight; a warning when the
counter's start is not.

AG117 (F7) the epoch's leftover leaks into the next epoch: the micro-batch loop runs
again and again (an epoch loop around it, or a ``*epoch*`` function), the step's
modulo guard counts from a start that resets every pass, and nothing outside the
micro-batch loop steps or clears the gradients. The last ``len % K`` micro-batches stay
in ``.grad`` and join the next epoch's first window. An error when the number of
micro-batches is spelled with constants (:mod:`.._lengths`) and not a multiple of K,
a warning when it is not in sight. A counter running across epochs is not a leak: its
windows span epochs with exactly K micro-batches each.


The modulo guard and counter analysis both rules use is in :mod:`._modguard`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import (
    FUNCS,
    LOOPS,
    call_attr,
    dotted,
    position,
    receiver,
    walk_local,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._lengths import static_len
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._harvest import harvests_grads
from accumguard.static.lint.families._modguard import (
    UNKNOWN_START,
    ModGuard,
    call_test,
    counter_start,
    exclusive,
    first_window,
    flag_guard,
    k_values,
    mod_guard,
    start_residues,
    top_statement,
    window_size_text,
)
from accumguard.static.lint.families._offboundary import off_boundary_guard
from accumguard.static.lint.families._windowtail import (
    boundary_equality,
    clears_first,
    clears_or_steps_outside,
    hand_for_windows,
    length_from_callers,
    pure_mod_guard,
    restarts_each_pass,
    site_in,
)
from accumguard.static.lint.families._zeroguard import first_micro_step_only, fsdp2_deferred_clear

_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _micro_steps_in_comprehension(ctx: FileContext, window: ast.AST) -> list[ast.AST]:
    """The comprehensions of ``window`` that hold every one of its backwards (``losses =
    [self.micro_step(b) for b in window_batches]``): the micro-steps run inside them, once
    per element, and a step after them runs once per window. Empty when a backward runs
    outside one."""
    comps: list[ast.AST] = []
    for b in ctx.window_backwards(window):
        c = ctx.enclosing(b, _COMPS)
        if c is None or ctx.enclosing(c, LOOPS) is not window and c is not window:
            return []
        if all(c is not x for x in comps):
            comps.append(c)
    return comps


def _site_in_window(ctx: FileContext, call: ast.AST, window: ast.AST) -> ast.AST | None:
    """Where ``call`` runs in the window's own function: the call itself, or the call of the
    helper (of a helper) it sits in (``self.optimizer_step()`` for a step inside it); None
    when that cannot be followed."""
    home = ctx.enclosing(window, FUNCS)
    sites = {**ctx.inlined(window), **ctx.reached(window)}
    node: ast.AST | None = call
    for _ in range(4):
        if node is None:
            return None
        fn = ctx.enclosing(node, FUNCS)
        if fn is home:
            return node
        node = sites.get(fn) if fn is not None else None
    return None


@rule("AG101")
def step_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    """An optimizer step in an accumulation window with no boundary condition."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if facts.summed_loss:
            continue  # the inner loop sums losses into one backward: K = 1
        comps = _micro_steps_in_comprehension(ctx, window)
        for call in facts.unguarded_optimizer_steps:
            name = dotted(receiver(call)) or "optimizer"
            site = _site_in_window(ctx, call, window) if comps else None
            if site is not None and not any(ctx.enclosing(site, _COMPS) is c for c in comps):
                continue  # the comprehension runs the window's micro-steps; the step follows it
            if facts.accelerate:
                yield ctx.finding(
                    "AG101",
                    call,
                    f"`{name}.step()`{ctx.via_text(call, window)} runs inside "
                    f"`accelerator.accumulate()` on an optimizer `accelerator.prepare()` never "
                    "wrapped: Accelerate skips the step and the clearing only of the optimizers "
                    "it prepared, so this one takes K small steps per window instead of one",
                    fix=f"pass `{name}` to `accelerator.prepare(...)` with the model and the "
                        "DataLoader, and step the optimizer it returns",
                )
                continue
            yield ctx.finding(
                "AG101",
                call,
                f"`{name}.step()`{ctx.via_text(call, window)} runs on every micro-batch of this "
                f"accumulation loop (line {getattr(window, 'lineno', '?')}) with no boundary condition: "
                "the optimizer takes K "
                "small steps instead of one",
            )


@rule("AG102")
def zero_grad_in_window(ctx: FileContext) -> Iterator[Finding]:
    """zero_grad (optimizer's or model's) on every micro-step of an accumulation window."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss:
            continue
        harvested = harvests_grads(ctx, window)
        for call, kind in facts.zero_grads:
            if ctx.guarded(call, window) and (off := off_boundary_guard(ctx, call, window)):
                test, period, k = off
                yield ctx.finding(
                    "AG102",
                    call,
                    f"`{ast.unparse(call.func)}()`{ctx.via_text(call, window)} runs when "
                    f"`{ast.unparse(test)}`, every {period} micro-batches, not at the window's "
                    f"boundary (every {k}): where it fires inside a window it erases the "
                    "gradient accumulated so far, and the optimizer steps on the rest of the "
                    "window only",
                )
                continue
            if facts.accelerate and kind == "optimizer" and not ctx.guarded(call, window) \
                    and _before_accelerator_backward(ctx, window, call):
                yield ctx.finding(
                    "AG102",
                    call,
                    f"`{ast.unparse(call.func)}()` comes before the window's "
                    "`accelerator.backward()`: Accelerate's prepared optimizer clears only on "
                    "the micro-step that closes the window, and there it runs before that "
                    "micro-step's backward, erasing the gradient of the window's earlier "
                    "micro-batches: only the last micro-batch reaches the optimizer",
                    fix="call `optimizer.zero_grad()` after `optimizer.step()` (the end of the "
                        "`accumulate()` block), not before the backward",
                )
                continue
            if ctx.guarded(call, window) or (facts.accelerate and kind == "optimizer"):
                continue
            if first_micro_step_only(ctx, call, window):
                continue  # the clear opens each window (`if i == 0:`): nothing accumulated yet
            if dotted(receiver(call)) in facts.own_rate:
                continue  # an optimizer stepping at its own rate clears its own window
            if harvested:
                continue  # each micro-step's .grad is added to a buffer of its own first
            if fsdp2_deferred_clear(ctx, call, window):
                continue
            name = dotted(receiver(call)) or "model"
            extra = (
                " (Accelerate gates the prepared optimizer's zero_grad, not the model's)"
                if facts.accelerate
                else ""
            )
            yield ctx.finding(
                "AG102",
                call,
                f"`{name}.zero_grad()`{ctx.via_text(call, window)} on every micro-batch erases the gradients accumulated so far: "
                f"only the last micro-batch reaches the optimizer{extra}",
            )


def _before_accelerator_backward(ctx: FileContext, window: ast.AST, call: ast.Call) -> bool:
    """``call`` is directly in a ``with accelerator.accumulate(...):`` block and comes before
    an ``accelerator.backward(...)`` of that block, with no optimizer step between them
    (``opt.zero_grad()`` at the top of the block), and no step of its own optimizer before it
    in the block."""
    block = ctx.enclosing(call, (ast.With, ast.For, ast.AsyncFor, ast.While))
    if not (isinstance(block, ast.With) and any(
            isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
            for i in block.items)):
        return False  # (at the top of the loop, before `accumulate()` decides the micro-step's
        # sync, the flag is the previous micro-step's: that clear follows the last step)
    calls = [n for n in ctx.local_nodes(block) if isinstance(n, ast.Call)]
    own = dotted(receiver(call))
    if own is not None and any(ctx.is_step(n) and getattr(n, "lineno", 0) < call.lineno
                               and dotted(receiver(n)) == own for n in calls):
        return False  # its own optimizer's step came first (two models' step-then-clear pairs
        # in one block, each after its own backward): the clear follows that step
    later = [n for n in calls if getattr(n, "lineno", 0) > call.lineno]
    backs = [n for n in later if call_attr(n) == "backward" and ctx.is_accelerator(receiver(n))]
    steps = [n for n in later if ctx.is_step(n)]
    return bool(backs) and not any(s.lineno < backs[0].lineno for s in steps)


def _grad_clears(ctx: FileContext, window: ast.AST) -> Iterator[ast.AST]:
    """``p.grad = None`` / ``p.grad.zero_()`` / ``p.grad.data.zero_()`` in the window, in a loop
    that does nothing else with ``.grad`` (a loop that first copies ``p.grad`` into its own
    buffer accumulates by hand and clears on purpose)."""
    for n in ctx.local_nodes(window):
        target: ast.AST | None = None
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is None:
            target = next((t for t in n.targets if isinstance(t, ast.Attribute) and t.attr == "grad"), None)
        elif isinstance(n, ast.Call) and call_attr(n) in ("zero_", "detach_") and isinstance(n.func, ast.Attribute):
            inner = n.func.value
            if isinstance(inner, ast.Attribute) and inner.attr == "data":
                inner = inner.value
            if isinstance(inner, ast.Attribute) and inner.attr == "grad" and call_attr(n) == "zero_":
                target = inner
        if target is None:
            continue
        loop = ctx.enclosing(n, (ast.For, ast.AsyncFor))
        if loop is None or loop is window:
            continue
        other_reads = [
            a for a in ctx.local_nodes(loop)
            if isinstance(a, ast.Attribute) and a.attr == "grad" and a is not target
            and not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and a is n.func.value)
        ]
        if not other_reads:
            yield n


@rule("AG102")
def grads_cleared_by_hand_in_window(ctx: FileContext) -> Iterator[Finding]:
    """``for p in model.parameters(): p.grad = None`` on every micro-step: zero_grad by hand
    (in the window, or in a closure or helper that runs the backward once per micro-step)."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss:
            continue
        for node in (n for part in (window, *ctx.inlined(window), *ctx.reached(window))
                     for n in _grad_clears(ctx, part)):
            if ctx.guarded(node, window):
                continue
            yield ctx.finding(
                "AG102",
                node,
                "the parameters' `.grad` is cleared on every micro-batch (a hand-written zero_grad): "
                "only the last micro-batch reaches the optimizer",
            )


@rule("AG105")
def clip_in_window(ctx: FileContext) -> Iterator[Finding]:
    """Clipping / unscale_ on every micro-step (not under DeepSpeed, which clips inside step)."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if facts.engine_steps_unguarded and not facts.unguarded_optimizer_steps and not facts.summed_loss:
            yield from _clip_beside_engine_step(ctx, window, facts.clips)
            continue
        if (
            not facts.accumulating
            or facts.unguarded_optimizer_steps
            or facts.summed_loss
        ):
            continue
        for call in facts.clips:
            if ctx.guarded(call, window) or _clips_own_rate(call, facts.own_rate):
                continue
            yield ctx.finding(
                "AG105",
                call,
                f"`{call_attr(call)}`{ctx.via_text(call, window)} runs on every micro-batch: it acts on a partial (and, under "
                "no_sync, unsynchronised) gradient; clip once on the full gradient at the boundary",
            )


def _clips_own_rate(call: ast.Call, own_rate: set[str]) -> bool:
    """The clip (or ``scaler.unscale_(opt)``) acts on an optimizer stepping at its own rate
    (``clip_grad_norm_(disc.parameters(), 1.0)``): its window is one micro-step."""
    if not own_rate or not call.args:
        return False
    return any(dotted(sub) in own_rate for sub in ast.walk(call.args[0]))


def _reads_engine_ga(ctx: FileContext) -> bool:
    """The script reads the engine's GA or its boundary (once per file, not per window)."""
    return bool(ctx._cached("reads_engine_ga", ctx.tree, lambda: any(
        call_attr(c) in ("gradient_accumulation_steps", "is_gradient_accumulation_boundary")
        and ctx.kind_of_receiver(receiver(c)) == "engine"
        for c in ctx.of(ast.Call)
    )))


def _clip_beside_engine_step(ctx: FileContext, window: ast.AST, clips: list[ast.Call]) -> Iterator[Finding]:
    """A DeepSpeed loop (``engine.step()`` after every backward) that clips by hand on every
    micro-batch: DeepSpeed only reduces and steps at its GA boundary, so with GA > 1 the clip
    acts on partial, unreduced gradients (F8). An error when the config in sight has GA > 1
    (ZeRO-0/1; a warning on ZeRO-2/3, whose ``.grad`` may be partitioned away), a warning when the config is out of sight but the script reads the engine's GA or its
    boundary (``gradient_accumulation_steps()``, ``is_gradient_accumulation_boundary()``);
    nothing with GA 1 or no sign of accumulation."""
    todo = [c for c in clips if call_attr(c) not in ("unscale_",) and not ctx.guarded(c, window)]
    if not todo:
        return
    ref = ctx.ds_config()
    ga = ref.ga if ref is not None else None
    if ref is not None and ga is None:  # `"gradient_accumulation_steps": args.grad_accum`
        node = ctx.ds_finder().value_node(ref, "gradient_accumulation_steps")
        ga = ctx.int_value(node) if node is not None else None
    if ref is not None and not (isinstance(ga, int) and ga > 1):
        return
    if ref is None and not _reads_engine_ga(ctx):
        return
    for call in todo:
        finding = ctx.finding(
            "AG105",
            call,
            f"`{call_attr(call)}` runs on every micro-batch beside `engine.step()`: DeepSpeed "
            "accumulates until its GA boundary, so the clip acts on a partial, unreduced gradient; "
            "set `gradient_clipping` in the config (DeepSpeed clips the full gradient at the "
            "boundary) or clip only when `engine.is_gradient_accumulation_boundary()`"
            + ("" if ref is not None else " (the config is not in sight: this holds when its GA > 1, "
               "which the script's use of the engine's GA suggests)"),
        )
        if ref is None or ref.stage not in (0, 1, None):
            # out of sight; or ZeRO-2/3, where .grad may be partitioned away between micro-steps
            finding = replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        yield finding


# ---------------------------------------------------------------- AG115: boundary counter off by one

@rule("AG115")
def boundary_counter_off_by_one(ctx: FileContext) -> Iterator[Finding]:
    """``if i % K == 0: optimizer.step()`` after the backward with ``i`` counting from 0."""
    for window in ctx.windows():
        if not isinstance(window, LOOPS):
            continue
        facts = ctx.window_facts(window)
        backwards = ctx.window_backwards(window)
        seen: set[int] = set()
        reached = ctx.reached(window)
        for call, kind in facts.steps:
            if kind not in ("optimizer", "engine"):
                continue
            helper = ctx.enclosing(call, FUNCS)
            if helper is not None and helper is not ctx.enclosing(window, FUNCS) \
                    and helper in reached and ctx.enclosing(call, (ast.If, *LOOPS)) is None:
                call = reached[helper]  # (``self.optimizer_step()`` under the window's test)
            guard_if = ctx.enclosing(call, (ast.If, *LOOPS))
            while (isinstance(guard_if, ast.If) and mod_guard(_test_of(ctx, guard_if.test)) is None
                   and flag_guard(ctx, guard_if.test, window) is None):
                guard_if = ctx.enclosing(guard_if, (ast.If, *LOOPS))
            if not isinstance(guard_if, ast.If) or id(guard_if) in seen:
                continue
            if exclusive(ctx, call, guard_if.body[0]):
                continue  # the step is in the else branch
            guard = mod_guard(_test_of(ctx, guard_if.test))
            tested: ast.AST = guard_if  # where the counter is read
            if guard is None and (flagged := flag_guard(ctx, guard_if.test, window)) is not None:
                guard, tested = flagged  # `do_step = i % K == 0` ... `if do_step:`
            top = top_statement(ctx, tested, window)
            if guard is None or top is None:
                continue
            seen.add(id(guard_if))
            pos = position(call)
            inside = set(map(id, walk_local(guard_if)))
            if any(id(b) in inside and position(b) < pos for b in backwards):
                continue  # the guarded block computes its own gradient (WGAN's n_critic, RL train_freq)
            before_step = [b for b in backwards if position(b) < pos and not exclusive(ctx, b, call)]
            after = bool(before_step)
            if not after and not all(position(b) > pos for b in backwards):
                continue
            start = counter_start(ctx, window, top, guard.counter)
            if start is None:
                continue
            if start is UNKNOWN_START:
                if guard.offset != 0 or not after or guard.excludes_zero:
                    continue
                sites = start_residues(ctx, window, guard)
                if sites is not None:
                    # the start comes from the callers: from 1 (mod K) everywhere is right
                    bad = [(site, arg) for site, arg, r in sites if r == 0]
                    if bad:
                        site, arg = bad[0]
                        yield ctx.finding(
                            "AG115",
                            guard_if,
                            f"`{guard.counter} % K == 0` gates the step after this micro-batch's "
                            f"backward, and the call at line {site.lineno} starts `{guard.counter}` "
                            f"at `{ast.unparse(arg)}`, a multiple of K: that run's first window "
                            "has 1 micro-batch and every later one is shifted"
                            + (" (the other calls count from 1)" if len(bad) < len(sites) else ""),
                        )
                    continue
                yield replace(
                    ctx.finding(
                        "AG115",
                        guard_if,
                        f"`{guard.counter} % K == 0` gates the step after this micro-batch's backward: "
                        f"if `{guard.counter}` counts micro-batches from 0, the first window has 1 "
                        "micro-batch; the counter's start is not in sight",
                    ),
                    severity=Severity.WARNING,
                    confidence=Confidence.MEDIUM,
                )
                continue
            assert isinstance(start, int)
            if guard.residue:
                finding = _residue_finding(ctx, guard_if, guard, start, after)
                if finding is not None:
                    yield finding
                continue
            t = start + guard.offset
            # first firing j0 = m*K + o micro-batches in (0-based), K symbolic
            m, o = (0, 0) if t == 0 else (1, -t) if t > 0 else (0, -t)
            if guard.excludes_zero and (m, o) == (0, 0) and start == 0:
                m, o = 1, 0
            n1 = (m, o + (1 if after else 0))
            if n1 in ((1, 0), (0, 0)):
                continue  # K micro-batches, or a no-op step before any backward
            where = "after" if after else "before"
            finding = ctx.finding(
                "AG115",
                guard_if,
                f"the step runs when {_test_text(guard_if, tested)}{_bound_text(ctx, guard_if.test)}, "
                f"{where} this micro-batch's "
                f"backward, with `{guard.counter}` = {start} on the first micro-batch: the first "
                f"window has {window_size_text(*n1)} micro-batch{'' if n1 == (0, 1) else 'es'} "
                "instead of K",
            )
            if 1 in ctx.int_candidates(guard.modulus):
                # `K = 1` in some configuration (a fallback, an argparse default): `i % 1 == 0`
                # steps every micro-batch, which is right for K = 1
                finding = replace(
                    finding,
                    evidence=finding.evidence + f" (when `{ast.unparse(guard.modulus)}` > 1; the file "
                    "also sets it to 1, where this is right)",
                    severity=Severity.WARNING,
                    confidence=Confidence.MEDIUM,
                )
            yield finding


def _test_of(ctx: FileContext, test: ast.AST) -> ast.AST:
    """The test itself, or for a call of a one-line predicate of the file (``is_boundary(i)``)
    what it returns with the call's arguments bound (:func:`call_test`)."""
    return call_test(ctx, test) or test


def _bound_text(ctx: FileContext, test: ast.AST) -> str:
    """`` (= `(i + 1) % K == 0`)`` for a predicate call read through :func:`call_test`."""
    bound = call_test(ctx, test)
    return "" if bound is None else f" (= `{ast.unparse(bound)}`)"


def _test_text(guard_if: ast.If, tested: ast.AST) -> str:
    """The ``if`` test as written (in backticks), with the flag's definition for a flag."""
    test = f"`{ast.unparse(guard_if.test)}`"
    if isinstance(tested, ast.Assign):
        return (f"{test} (`{ast.unparse(tested.targets[0])}` = "
                f"`{ast.unparse(tested.value)}`)")
    return test


def _micro_batches(n: int) -> str:
    return f"{n} micro-batch" + ("" if n == 1 else "es")


def _residue_finding(ctx: FileContext, guard_if: ast.If, guard: ModGuard, start: int, after: bool) -> Finding | None:
    """``if i % K == r:`` (r >= 1): the first window has K micro-batches for one value of K
    at most (``i % K == 1`` after the backward, ``i`` from 0: only K = 2), so the rule reads
    K's values. An error when every value in sight is wrong, a warning when some value is not
    in sight; nothing when a value in sight makes the window right (or never fires: K <= r)."""
    values = k_values(ctx, guard.modulus, guard_if)
    known = sorted(v for v in values if v is not None)
    if any(k <= guard.residue or first_window(start, guard.offset, k, after, guard.excludes_zero) in (0, k)
           for k in known):
        return None
    test = ast.unparse(guard_if.test)
    if known:
        sizes = ", ".join(
            _micro_batches(first_window(start, guard.offset, k, after, guard.excludes_zero)) + f" instead of K = {k}"
            for k in known
        )
        what = f"the first window has {sizes}"
    else:
        n = first_window(start, guard.offset, 64, after, guard.excludes_zero)  # any K well above r
        if n == 0:
            return None  # a no-op step before the first backward
        what = f"the first window has {_micro_batches(n)}, right only for K = {n}"
    where = "after" if after else "before"
    finding = ctx.finding(
        "AG115",
        guard_if,
        f"the step runs when `{test}`, {where} this micro-batch's backward, with `{guard.counter}` = "
        f"{start} on the first micro-batch: {what} (the remainder {guard.residue} shifts every "
        "boundary; `== 0` on the 1-based count is the usual test)",
    )
    if None in values:
        finding = replace(
            finding,
            evidence=finding.evidence + f"; `{ast.unparse(guard.modulus)}` is not fully in sight",
            severity=Severity.WARNING,
            confidence=Confidence.MEDIUM,
        )
    return finding


@rule("AG115")
def deepspeed_boundary_off_by_one(ctx: FileContext) -> Iterator[Finding]:
    """``engine.set_gradient_accumulation_boundary(i % K == 0)`` before this micro-batch's
    backward (``engine.step()`` on every micro-batch applies the update at a boundary), with
    ``i`` counting from 0: the first window closes on its first micro-batch. A test with
    another part (``or i == len(loader) - 1``, the pass's last window) is read by its modulo
    part."""
    for call in ctx.of(ast.Call):
        if call_attr(call) != "set_gradient_accumulation_boundary" or not call.args:
            continue
        window = ctx.enclosing(call, LOOPS)
        if window is None:
            continue
        scope = ctx.enclosing(call, FUNCS) or ctx.tree
        test = call.args[0]
        if isinstance(test, ast.Name):
            values = ctx.assigned_in(scope).get(test.id, [])
            test = values[0] if len(values) == 1 else test
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
        guard = next((g for p in parts if (g := mod_guard(p)) is not None), None)
        top = top_statement(ctx, call, window)
        if guard is None or top is None or guard.residue or guard.excludes_zero:
            continue
        if not any(position(b) > position(call) for b in ctx.window_backwards(window)):
            continue  # (the flag set after the backward is read at the next one)
        start = counter_start(ctx, window, top, guard.counter)
        if type(start) is not int or start + guard.offset != 0:
            continue  # (i + 1) % K == 0 from 0: the K-th micro-batch closes the window
        yield ctx.finding(
            "AG115",
            call,
            f"`{ast.unparse(call)}` marks the boundary when `{guard.counter} % K == 0`, before "
            f"this micro-batch's backward, with `{guard.counter}` = {start} on the first "
            "micro-batch: the engine closes the first window on its first micro-batch, every "
            "later window is shifted by one and the pass's last K - 1 micro-batches close "
            "short",
            fix=f"mark the boundary when `({guard.counter} + 1) % K == 0` (or on the pass's last "
                "micro-batch)",
        )


# ---------------------------------------------------------------- AG117: the epoch's leftover


def _breaks_on(ctx: FileContext, window: ast.AST, counter: str) -> bool:
    """The window's loop has a ``break`` of its own under a test of ``counter``."""
    for n in ast.walk(window):
        if not isinstance(n, ast.Break) or ctx.enclosing(n, LOOPS) is not window:
            continue
        test = ctx.enclosing(n, (ast.If,))
        if isinstance(test, ast.If) and any(isinstance(x, ast.Name) and x.id == counter
                                            for x in ast.walk(test.test)):
            return True
    return False

@rule("AG117")
def partial_window_leaks_into_next_epoch(ctx: FileContext) -> Iterator[Finding]:
    """``for epoch ...: for i, b in enumerate(loader): ... if (i + 1) % K == 0: step`` with
    nothing after the inner loop: the last ``len(loader) % K`` micro-batches stay in .grad."""
    for window, facts in hand_for_windows(ctx):
        around = ctx.enclosing(window, (*LOOPS, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        if isinstance(around, LOOPS):
            repeat: ast.AST = around
            again = f"every pass of the loop at line {around.lineno}"
        elif isinstance(around, ast.FunctionDef | ast.AsyncFunctionDef) and "epoch" in around.name.lower():
            repeat = around
            again = f"every call of `{around.name}()`"
        else:
            continue  # one pass: a leftover at the very end of training is never applied, not leaked
        backwards = ctx.window_backwards(window)
        for call, kind in facts.steps:
            if kind != "optimizer":
                continue
            hit = pure_mod_guard(ctx, call, window)
            if hit is None:
                continue
            guard_if, guard = hit
            top = top_statement(ctx, guard_if, window)
            fn = ctx.enclosing(call, FUNCS)
            site = site_in(ctx, fn, window) if fn is not None and fn is not \
                ctx.enclosing(window, FUNCS) else None
            at = position(site if site is not None else call)  # (a helper's step: its call)
            if top is None or not any(position(b) < at for b in backwards):
                continue
            start = counter_start(ctx, window, top, guard.counter)
            if type(start) is not int or start + guard.offset != 1:
                continue  # not windows of exactly K (AG115's business) or a start not in sight
            if not restarts_each_pass(ctx, window, guard.counter, repeat):
                continue  # a counter across epochs: windows span epochs, each of K micro-batches
            if _breaks_on(ctx, window, guard.counter):
                continue  # `if i >= full: break`: the leftover may never run
            clears, flush = clears_or_steps_outside(ctx, window, repeat)
            if clears or (flush is not None and clears_first(ctx, window, backwards)):
                continue
            ks = k_values(ctx, guard.modulus, guard_if)
            if 1 in ks:
                continue  # K = 1 somewhere: nothing is left over
            k = next(iter(ks)) if len(ks) == 1 else None  # a parameter's default when no call passes K
            n = static_len(ctx, window.iter)
            if n is None:
                n = length_from_callers(ctx, window)
            data = ast.unparse(window.iter)
            test = f"`{ast.unparse(guard_if.test)}`{_bound_text(ctx, guard_if.test)}"
            value = boundary_equality(ctx, guard_if.test, window)
            if value is not guard_if.test:
                test += f" (= `{ast.unparse(value)}`)"
            head = (
                f"the step runs when {test}, with `{guard.counter}` starting again at {again}, "
                + ("and nothing steps or clears the gradients after this loop" if flush is None
                   else f"and `{ast.unparse(flush)}` (line {flush.lineno}) steps on the pass's "
                        "last partial window after this loop but nothing clears the gradients "
                        "after it: that window's gradient is applied there and again in the next "
                        "pass's first window")
            )
            if n is not None and k is not None:
                if n % k == 0:
                    continue
                r = n % k
                yield replace(
                    ctx.finding(
                        "AG117",
                        guard_if,
                        f"{head}: `{data}` gives {n} micro-batches, {r} left after the last full "
                        f"window of {k}; their gradients stay in .grad and are added to the next "
                        f"pass's first window ({k + r} micro-batches in one step)"
                        + (" instead of being stepped on or dropped" if flush is None else ""),
                    ),
                    severity=Severity.ERROR,
                    confidence=Confidence.HIGH,
                )
                continue
            yield replace(
                ctx.finding(
                    "AG117",
                    guard_if,
                    (f"{head}: when the number of micro-batches per pass is not a multiple of K, "
                     "the last len % K of them stay in .grad and are added to the next pass's "
                     "first window (it is not in sight whether the length divides by K)")
                    if flush is None else
                    (f"{head} (when a pass leaves a partial window; it is not in sight whether "
                     "the number of micro-batches per pass is a multiple of K)"),
                ),
                severity=Severity.WARNING,
                confidence=Confidence.MEDIUM,
            )
