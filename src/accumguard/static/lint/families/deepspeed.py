"""DeepSpeed rules: who gates the accumulation boundary, and the config written in the script.

AG109 (F2) the loop calls ``engine.step()`` once per several ``engine.backward()``
      while the config has GA 1 (or none) on ZeRO-1/2: every backward is a
      boundary and only the last micro-batch survives. Not reported on ZeRO-0/3
      (they accumulate correctly), with ``managed_gradient_accumulation: false``
      (then ``step()`` *is* the boundary, the documented fix), or when the loop
      marks the boundary itself (``coalesce_grad_reduction``,
      ``set_gradient_accumulation_boundary``, ``no_sync``).
AG110 (F14) the same hand-gated loop while the config's GA is K > 1: double gating; or,
      config in sight or not, a loop whose K is the engine's own
      ``engine.gradient_accumulation_steps()`` around one ``step()``; or, config out of
      sight (``--deepspeed_config`` on the command line), a ``step()`` gated by the loop's
      own modulo while the loss handed to ``backward()`` is never divided: the loop leaves
      the 1/K to the engine's GA, which then gates a second time (and with GA 1 the step
      applies K times the mean gradient).
AG139 (F14/F2) the same hand-gated loop, loss divided by K, config out of sight (or in sight
      without a readable GA or stage, both passed in by the caller): a
      warning naming the configs that make it wrong (GA = K; GA 1 on ZeRO-1/2).
AG200-AG207: a config written as a dict literal in the script gets exactly the
      checks ``accumguard check-config`` applies to a file, at the script's lines; a config
      file that a DeepSpeed script (or the HF Trainer's ``deepspeed=``) names gets AG204 (the
      dtype its windows are summed in) and, outside the HF Trainer, AG203 (DeepSpeed's
      default clipping when the file sets no ``gradient_clipping``) at the line that names it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static import dsconfig
from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import (
    FUNCS,
    LOOPS,
    call_attr,
    dotted,
    mult_factors,
    receiver,
    walk_all,
    walk_local,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._dsrefs import DsConfigRef
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import param_arguments

_CONFIG_CODES = ("AG200", "AG201", "AG203", "AG204", "AG205", "AG206", "AG207")


def _named(where: str) -> str:
    """``where`` a config was found, as the words after a finding's evidence."""
    return f"DeepSpeed {where}" if where.startswith("config") else f"DeepSpeed config {where}"


def _hand_gated_steps(ctx: FileContext) -> list[tuple[ast.AST, ast.Call]]:
    """(window, engine.step() call) where the loop decides the boundary itself: a step under
    a boundary condition, or one step after an inner loop of backwards."""
    return ctx._cached("hand_gated_steps", ctx.tree,  # type: ignore[no-any-return]
                       lambda: list(_hand_gated_steps_uncached(ctx)))


def _hand_gated_steps_uncached(ctx: FileContext) -> Iterator[tuple[ast.AST, ast.Call]]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.engine_backward:
            continue
        engine_steps = [c for c, k in facts.steps if k == "engine"]
        gated = [c for c in engine_steps if ctx.guarded(c, window)]
        if gated:
            yield window, gated[0]
            continue
        if engine_steps or not isinstance(window, LOOPS):
            continue
        # the loop around the micro-batch loop, or (a `train_step(batch)` helper) its function
        outer = ctx.enclosing(window, LOOPS + FUNCS)
        if outer is None:
            continue
        for n in walk_local(outer):
            if (
                isinstance(n, ast.Call)
                and call_attr(n) == "step"
                and ctx.kind_of_receiver(receiver(n)) == "engine"
                and n.lineno > getattr(window, "end_lineno", window.lineno)
            ):
                yield window, n
                break


def _loop_k_names(ctx: FileContext, window: ast.AST, site: ast.Call) -> set[str]:
    """Dotted names the loop uses as its K: the modulo of the step's guard, the micro-batch
    loop's ``range(K)`` / ``batch.chunk(K)``, a divisor of the loss in the window."""
    exprs: list[ast.AST] = []
    cur = ctx.parents.get(site)
    while cur is not None and cur is not window:
        if isinstance(cur, ast.If):
            exprs += [n.right for n in walk_all(cur.test) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
        cur = ctx.parents.get(cur)
    if isinstance(window, ast.For | ast.AsyncFor):
        it = window.iter
        if isinstance(it, ast.Call) and dotted(it.func) == "enumerate" and it.args:
            it = it.args[0]
        if isinstance(it, ast.Call) and it.args:
            name = call_attr(it)
            if name == "range":
                exprs.append(it.args[-1] if len(it.args) < 3 else it.args[1])
            elif name in ("chunk", "split", "tensor_split", "array_split"):
                exprs.append(it.args[0])
    exprs += [n.right for n in ctx.local_nodes(window) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]
    return {d for e in exprs if (d := dotted(e)) is not None}


def _config_ga(ctx: FileContext, ref: DsConfigRef, k_names: set[str]) -> tuple[str, str]:
    """('one' | 'many' | 'unknown', how the config's gradient_accumulation_steps was read)."""
    cfg = ref.cfg
    finder = ctx.ds_finder()
    if "gradient_accumulation_steps" not in cfg:
        if cfg.partial:
            return "unknown", ""
        tbs, micro = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
        if tbs is None or micro is None:
            return "one", "absent (DeepSpeed then uses 1)"
        if isinstance(tbs, int) and isinstance(micro, int):
            # GA = train_batch_size / (micro x W): 1 for sure only when the two are equal
            return ("one", "1 (train_batch_size = micro batch size)") if tbs == micro else ("unknown", "")
        t_node = finder.value_node(ref, "train_batch_size")
        m_node = finder.value_node(ref, "train_micro_batch_size_per_gpu")
        if t_node is None or m_node is None:
            return "unknown", ""
        rest = mult_factors(t_node)
        for f in mult_factors(m_node):
            match = next((r for r in rest if ast.dump(r) == ast.dump(f)), None)
            if match is None:
                return "unknown", ""
            rest.remove(match)
        rest = [r for r in rest if not ctx.mentions_world(r)]
        if not rest:
            return "one", "1 (train_batch_size = micro batch x world size)"
        if len(rest) == 1:
            return _ga_expression(ctx, rest[0], k_names, "derived from train_batch_size as ")
        return "unknown", ""
    raw = cfg["gradient_accumulation_steps"]
    if type(raw) is int and raw > 0:
        return ("one" if raw == 1 else "many"), str(raw)
    if raw is not dsconfig.UNKNOWN:
        return "unknown", ""  # "auto" (filled by the HF Trainer) or an invalid value (AG200)
    node = finder.value_node(ref, "gradient_accumulation_steps")
    return ("unknown", "") if node is None else _ga_expression(ctx, node, k_names, "")


def _ga_expression(
    ctx: FileContext, node: ast.AST, k_names: set[str], prefix: str, depth: int = 0
) -> tuple[str, str]:
    """GA written as an expression: the loop's own K (then GA = K), or an integer in sight; a
    parameter of the function that builds the config (``def ds_config(gas): return {...:
    gas}``) is read at each call of it (``ds_config(args.gas)``, the loop's ``range(args.gas)``)."""
    text = f"{prefix}`{ast.unparse(node)}`"
    d = dotted(node)
    func = ctx.enclosing(node, FUNCS)
    if isinstance(node, ast.Name) and isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) and depth < 2:
        passed = param_arguments(ctx, func, node.id)
        if passed:  # a parameter of the builder: every value its calls pass must agree
            verdicts = {
                ("unknown", "") if arg is None else _ga_expression(ctx, arg, k_names, "", depth + 1)
                for arg in passed
            }
            kinds = {v for v, _ in verdicts}
            if len(kinds) != 1 or kinds == {"unknown"}:
                return "unknown", ""
            hows = sorted(h for _, h in verdicts)
            return kinds.pop(), f"{text} (passed {', '.join(hows)})"
    if d is not None and d in k_names:
        literal = ctx.int_value(node, defaults=False)
        if literal == 1:
            return "unknown", ""  # K = 1: the loop does not accumulate
        return "many", f"{text}, the loop's own K"
    alias = ctx.values_by_name().get(d, []) if d is not None and depth < 2 else []
    if len(alias) == 1 and dotted(alias[0]) not in (None, d):
        # `K, m = args.gas, args.micro` then {"gradient_accumulation_steps": K}: read through
        verdict, how = _ga_expression(ctx, alias[0], k_names, "", depth + 1)
        if verdict != "unknown":
            return verdict, f"{text} (= {how})"
    value = ctx.int_value(node)
    if value is None or value < 1:
        return "unknown", ""
    return ("one" if value == 1 else "many"), f"{text} = {value}"


def _engine_ga_names(ctx: FileContext) -> set[str]:
    """Dotted names that hold the engine's own GA: ``engine.gradient_accumulation_steps()``
    itself and the names assigned from it (``gas = engine.gradient_accumulation_steps()``,
    ``k = int(gas)``), to a fixpoint."""
    def compute() -> set[str]:
        out: set[str] = set()
        for call in ctx.of(ast.Call):
            if (
                call_attr(call) == "gradient_accumulation_steps"
                and not call.args and not call.keywords
                and ctx.kind_of_receiver(receiver(call)) == "engine"
                and (d := dotted(call)) is not None
            ):
                out.add(d)
        for _ in range(3):
            before = len(out)
            for names, value in ctx.assignments():
                v = value
                while isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "int" and v.args:
                    v = v.args[0]
                if len(names) == 1 and names[0] not in out and dotted(v) in out:
                    out.add(names[0])
            if len(out) == before:
                break
        return out
    return ctx._cached("engine_ga_names", ctx.tree, compute)  # type: ignore[no-any-return]


def _undivided_hand_gated(ctx: FileContext, window: ast.AST, site: ast.Call) -> str | None:
    """The K of ``if <counter> % K == ...: engine.step()`` when every ``engine.backward(loss)``
    of the window gets a loss nothing scaled (:func:`_plain_loss`) and K divides nothing
    anywhere in the file (a helper may divide the loss by it). None otherwise."""
    mods: list[ast.AST] = []
    cur = ctx.parents.get(site)
    while cur is not None and cur is not window:
        if isinstance(cur, ast.If) and site not in getattr(cur, "orelse", ()):
            mods += [n.right for n in walk_all(cur.test) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
        cur = ctx.parents.get(cur)
    k_names = {d for m in mods if (d := dotted(m)) is not None}
    if len(mods) != 1 or not k_names:
        return None
    if k_names & _divisors(ctx):
        return None  # K divides something: the loss, maybe in a helper (`// K` counts updates)
    local_funcs = _local_funcs(ctx)
    scope = ctx.scope_of(window)
    backwards = [
        n for n in ctx.local_nodes(window)
        if isinstance(n, ast.Call) and call_attr(n) == "backward"
        and ctx.kind_of_receiver(receiver(n)) == "engine"
    ]
    if not backwards:
        return None
    for call in backwards:
        if len(call.args) != 1 or call.keywords:
            return None  # scale_wrt_gas=..., retain_graph: not the plain form
        if not _plain_loss(ctx, scope, call.args[0], k_names, local_funcs, set()):
            return None
    return ", ".join(sorted(k_names))


def _divisors(ctx: FileContext) -> set[str]:
    """Dotted names that divide something in the file (``x / K``, ``x /= K``), once per file."""
    def compute() -> set[str]:
        out: set[str] = set()
        for n in ctx.of(ast.BinOp, ast.AugAssign):
            if isinstance(n.op, ast.Div):
                for side in (n.left, n.right) if isinstance(n, ast.BinOp) else (n.value,):
                    if (d := dotted(side)) is not None:
                        out.add(d)
        return out
    return ctx._cached("ds_divisors", ctx.tree, compute)  # type: ignore[no-any-return]


def _local_funcs(ctx: FileContext) -> set[str]:
    return ctx._cached(  # type: ignore[no-any-return]
        "ds_local_funcs", ctx.tree, lambda: {f.name for f in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)}
    )


def _name_values(ctx: FileContext, scope: ast.AST) -> tuple[dict[str, list[ast.AST]], set[str]]:
    """For ``scope``: the values assigned to each plain name (tuple targets included) and the
    names an augmented or annotated assignment writes; once per scope."""
    def compute() -> tuple[dict[str, list[ast.AST]], set[str]]:
        values: dict[str, list[ast.AST]] = {}
        rewritten: set[str] = set()
        for n in ctx.local_nodes(scope):
            if isinstance(n, ast.AugAssign | ast.AnnAssign) and isinstance(n.target, ast.Name):
                rewritten.add(n.target.id)
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    for x in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                        if isinstance(x, ast.Name):
                            values.setdefault(x.id, []).append(n.value)
        return values, rewritten
    return ctx._cached("ds_name_values", scope, compute)  # type: ignore[no-any-return]


_SCALING_METHODS = {"div", "div_", "mul", "mul_", "true_divide", "divide", "multiply", "__truediv__", "__mul__"}


def _plain_loss(
    ctx: FileContext, scope: ast.AST, expr: ast.AST, k_names: set[str], local_funcs: set[str], seen: set[str]
) -> bool:
    """``expr`` is a loss nothing scaled: followed along its spine (a name to its assignments
    in ``scope``, ``out.loss``/``out[0]`` to ``out``, ``loss.mean()`` to ``loss``) down to
    calls of functions the file does not define, with no arithmetic and no K on the way.
    Arithmetic inside the calls' arguments (the inputs) does not scale the loss."""
    if isinstance(expr, ast.Name):
        if expr.id in seen:
            return True
        seen.add(expr.id)
        values, rewritten = _name_values(ctx, scope)
        if expr.id in rewritten:
            return False
        return all(_plain_loss(ctx, scope, v, k_names, local_funcs, seen) for v in values.get(expr.id, ()))
    if isinstance(expr, ast.Attribute | ast.Subscript):
        return _plain_loss(ctx, scope, expr.value, k_names, local_funcs, seen)
    if isinstance(expr, ast.Call):
        if any(dotted(n) in k_names for n in walk_all(expr) if isinstance(n, ast.Name | ast.Attribute)):
            return False
        name = (dotted(expr.func) or "").split(".")[-1]
        if name in local_funcs or name in _SCALING_METHODS:
            return False  # a helper of the script may divide; loss.div(...) scales
        return not isinstance(expr.func, ast.Attribute) or _plain_loss(
            ctx, scope, expr.func.value, k_names, local_funcs, seen
        )
    return False  # arithmetic, a conditional, anything else: cannot tell


def _config_out_of_sight(ctx: FileContext, window: ast.AST, site: ast.Call,
                         ref: DsConfigRef | None = None) -> Iterator[Finding]:
    """A hand-gated ``engine.step()`` whose config's GA (or stage) is not in sight: GA is not
    guessed, but a loop that gates step() with its own modulo and hands engine.backward() a
    loss it never divides is wrong for every GA (GA = K gates twice, F14; GA = 1 applies K
    times the mean gradient): AG110; a loss divided by K is right only with GA 1 on ZeRO-0/3
    or managed_gradient_accumulation false: AG139, a warning."""
    name = dotted(receiver(site)) or "engine"
    sight = ("is not in sight (command line)" if ref is None else
             f"({ref.where}) does not show its gradient_accumulation_steps and ZeRO stage (values passed in)")
    if (k := _undivided_hand_gated(ctx, window, site)) is not None:
        yield ctx.finding(
            "AG110",
            site,
            f"`{name}.step()` is gated by hand every `{k}` micro-batches and the loss given to "
            "`backward()` is never divided by it, so the loop relies on DeepSpeed to scale the "
            "loss by 1/GA: with the config's gradient_accumulation_steps = K the engine gates a "
            "second time and steps once per K x K micro-batches (double gating); with GA = 1 "
            f"the step applies K times the mean gradient (the config {sight})",
        )
        return
    yield ctx.finding(
        "AG139",
        site,
        f"`{name}.step()` runs once per several `backward()` calls and the DeepSpeed config "
        f"{sight}: with gradient_accumulation_steps = K the engine "
        "gates a second time and steps once per K x K micro-batches; with GA 1 on ZeRO-1/2 "
        "every backward is a boundary and the optimizer trains on the last micro-batch "
        "only; only GA 1 on ZeRO-0/3 (an all-reduce per micro-batch) or "
        "managed_gradient_accumulation false makes this loop right, and only if its "
        "loss is divided by K",
    )


@rule("AG109", "AG110", "AG139")
def engine_gating(ctx: FileContext) -> Iterator[Finding]:
    if ctx.explicit_ds_boundary:
        return
    sites = list(_hand_gated_steps(ctx))
    engine_ga = _engine_ga_names(ctx)
    by_engine: set[int] = set()
    for window, site in sites:
        # K read from the engine itself (`for _ in range(engine.gradient_accumulation_steps())`
        # around one step()): double gating whatever the config says, and the config may be
        # out of sight (`--deepspeed_config` on the command line). With GA 1 the loop is K = 1.
        used = sorted(_loop_k_names(ctx, window, site) & engine_ga)
        if not used:
            continue
        by_engine.add(id(site))
        name = dotted(receiver(site)) or "engine"
        seen = (
            "the engine's own GA" if used[0].endswith("gradient_accumulation_steps()")
            else f"`{used[0]}` (the engine's own gradient_accumulation_steps(), GA)"
        )
        yield ctx.finding(
            "AG110",
            site,
            f"`{name}.step()` runs once per {seen} backward() calls: DeepSpeed already steps the optimizer "
            "only on every GA-th step() call, so it steps once per GA x GA micro-batches instead of "
            "once per GA (double gating); expected one engine.step() after every engine.backward()",
        )
    ref = ctx.ds_config()
    if ref is None:
        for window, site in sites:
            if id(site) not in by_engine:
                yield from _config_out_of_sight(ctx, window, site)
        return
    if ref.managed is False:
        return  # step() is the boundary: a hand-gated loop is what this mode expects
    for window, site in sites:
        if id(site) in by_engine:
            continue
        name = dotted(receiver(site)) or "engine"
        verdict, how = _config_ga(ctx, ref, _loop_k_names(ctx, window, site))
        if verdict == "one" and ref.stage is None and _undivided_hand_gated(ctx, window, site) is None:
            # GA 1 in sight, the stage passed in: wrong on ZeRO-1/2, right on ZeRO-0/3
            yield replace(ctx.finding(
                "AG109",
                site,
                f"`{name}.step()` is called once per several `backward()` calls, but the "
                f"DeepSpeed config ({ref.where}) has gradient_accumulation_steps {how} and its "
                "ZeRO stage is passed in: on ZeRO-1/2 every backward is a boundary, so the "
                "optimizer trains on the last micro-batch only (right on ZeRO-0/3)",
            ), severity=Severity.WARNING, confidence=Confidence.MEDIUM)
            continue
        if verdict == "unknown" or (verdict == "one" and ref.stage is None):
            # the config is in sight but what decides cannot be read (a GA or stage passed in
            # from the caller): judged as a config out of sight
            yield from _config_out_of_sight(ctx, window, site, ref)
            continue
        if verdict == "one":
            stage = ref.stage
            if stage not in (1, 2):
                continue  # ZeRO-0/3 accumulate right with GA 1
            yield ctx.finding(
                "AG109",
                site,
                f"`{name}.step()` is called once per several `backward()` calls, but the DeepSpeed "
                f"config ({ref.where}) has gradient_accumulation_steps {how} on ZeRO-{stage}: every "
                "backward is a boundary, so the optimizer trains on the last micro-batch only",
            )
        elif verdict == "many":
            yield ctx.finding(
                "AG110",
                site,
                f"`{name}.step()` is gated by hand while the DeepSpeed config ({ref.where}) has "
                f"gradient_accumulation_steps {how}: the engine counts one micro-step per step() "
                "call, so it steps every K x GA micro-batches, on the last micro-batch only",
            )


def _ga_named_f12(ctx: FileContext, ref: DsConfigRef) -> list[Finding]:
    """AG204 of a config dict whose ``gradient_accumulation_steps`` is a name the file gives
    one integer (``GA = 256``; the config check sees a computed value and stays silent):
    judged with that value; with an argparse default it is the run's K unless the command line
    says otherwise, so at most a warning."""
    node = ref.node
    if not isinstance(node, ast.Dict) or ref.cfg.get("gradient_accumulation_steps") is not dsconfig.UNKNOWN:
        return []
    value = next((v for k, v in zip(node.keys, node.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "gradient_accumulation_steps"), None)
    ga = ctx.int_value(value, defaults=False)
    by_default = ga is None
    ga = ctx.int_value(value) if by_default else ga
    if ga is None:
        return []
    cfg = dsconfig.ConfigDict({**ref.cfg, "gradient_accumulation_steps": ga},
                              key_lines=ref.cfg.key_lines, partial=ref.cfg.partial)
    out = [f for f in dsconfig.check_config(cfg) if f.code == "AG204"]
    if by_default:
        # the script as written runs that K (what lint reads); a command line may change it
        out = [replace(f, evidence=f"{f.evidence} (K = {ga} is the default of a setting the "
                       "command line may change)") for f in out]
    return out


@rule(*_CONFIG_CODES)
def config_literal_checks(ctx: FileContext) -> Iterator[Finding]:
    """check-config's checks on each DeepSpeed config dict literal in the script."""
    for ref in ctx.ds_config_literals():
        for f in [*dsconfig.check_config(ref.cfg), *_ga_named_f12(ctx, ref)]:
            if f.code == "AG203" and ref.hf:
                continue  # the HF Trainer's max_grad_norm (default 1.0) is the clipping asked for
            line = f.line or getattr(ref.node, "lineno", 1)
            yield replace(
                f,
                evidence=f"{f.evidence} ({_named(ref.where)})",
                path=None,  # the script's path, given by the runner
                line=line,
                col=1 if f.line else getattr(ref.node, "col_offset", 0) + 1,
            )
    named = ctx.ds_config()
    if named is not None and not named.literal and (ctx.deepspeed or named.hf):
        # a config file the script names: its other keys are check-config's, but the dtype
        # the engine sums this script's windows in (F12) and the clipping DeepSpeed applies
        # to them when the file sets none (F9; the HF Trainer's max_grad_norm is asked for)
        # are said at the name's line
        for f in dsconfig.check_config(named.cfg):
            if f.code == "AG204" or (f.code == "AG203" and not named.hf):
                yield replace(f, evidence=f"{f.evidence} ({_named(named.where)})",
                              path=None, line=getattr(named.node, "lineno", 1),
                              col=getattr(named.node, "col_offset", 0) + 1, key=None)


def engine_ga_above_one(ctx: FileContext) -> bool:
    """The DeepSpeed config in sight sets gradient_accumulation_steps above 1, or to a name
    that says it is the accumulation count (``c.accum``, its value out of sight)."""
    ref = ctx.ds_config()
    if ref is None:
        return False
    verdict = _config_ga(ctx, ref, set())[0]
    node = ctx.ds_finder().value_node(ref, "gradient_accumulation_steps")
    return verdict == "many" or (verdict == "unknown" and node is not None
                                 and ctx.mentions_accum(node))
