"""AG177 (F9): a clip setting of the script that never reaches the Hugging Face Trainer;
AG182 (F9): DeepSpeed's ``gradient_clipping: 0`` dropped by a filter of truthy values (or
by Accelerate's ``DeepSpeedPlugin``, which keeps only a truthy one).

``TrainingArguments`` clips every optimizer step at ``max_grad_norm`` = 1.0 unless told
otherwise. A script that keeps its own clip setting (a config field ``grad_clip: float =
0.0``, a constant ``MAX_GRAD_NORM = 5.0``) and builds ``TrainingArguments(...)`` without
``max_grad_norm=`` and never reads that setting anywhere runs with the Trainer's default clip,
not its own: at 0.0 (no clipping meant) every step whose norm exceeds 1 is scaled down. Judged
when the setting is a number other than 1.0, defined once (a dataclass field, a module
constant or an argparse default) and never read; a warning, since the default may be
acceptable. Also warned: an argparse clip option that is None when not given, with a help
text saying that means no clipping, passed to TrainingArguments through a ``**`` dict that
drops the None values (the Trainer never hears of it).

AG370 (F9): clipping switched off by leaving ``max_grad_norm`` out of the Trainer's arguments
(``{"max_grad_norm": m} if cfg.clip_grad else {}`` spread in): the Trainer's default 1.0
clips; an error when the switch is off by default.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["clip_setting_never_given_to_trainer", "clip_switched_off_by_leaving_it_out",
           "zero_clip_dropped_before_deepspeed"]

_ARGS = re.compile(r"TrainingArguments$|^(SFT|DPO|GRPO|Reward|PPO|KTO|ORPO|CPO)Config$")
_CLIP = re.compile(r"^(grad_clip|clip_grad|clip_grad_norm|grad_norm_clip|max_grad_norm|"
                   r"gradient_clipping|clip_norm|max_norm|grad_clip_norm)$", re.IGNORECASE)


def _settings(ctx: FileContext) -> list[tuple[str, ast.AST, float]]:
    """(name, definition, value) of clip settings: dataclass fields and module constants
    with a numeric literal, argparse options with a numeric default."""
    out: list[tuple[str, ast.AST, float]] = []
    for n in ctx.of(ast.AnnAssign, ast.Assign):
        targets = [n.target] if isinstance(n, ast.AnnAssign) else n.targets
        value = n.value
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else None
            if name and _CLIP.match(name) and isinstance(value, ast.Constant) \
                    and isinstance(value.value, int | float) and not isinstance(value.value, bool):
                out.append((name, n, float(value.value)))
    for c in ctx.of(ast.Call):
        if not (isinstance(c.func, ast.Attribute) and c.func.attr == "add_argument" and c.args
                and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)):
            continue
        name = c.args[0].value.lstrip("-").replace("-", "_")
        default = next((k.value for k in c.keywords if k.arg == "default"), None)
        if _CLIP.match(name) and isinstance(default, ast.Constant) \
                and isinstance(default.value, int | float) and not isinstance(default.value, bool):
            out.append((name, c, float(default.value)))
    return out


def _read(ctx: FileContext, name: str, definition: ast.AST) -> bool:
    """``name`` is read somewhere other than where it is defined."""
    own = set(map(id, walk_all(definition)))
    for n in walk_all(ctx.tree):
        if id(n) in own:
            continue
        if isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, ast.Constant) and n.value == name:
            return True  # getattr(cfg, "grad_clip"), cfg["grad_clip"]
    return False


_NO_CLIP = re.compile(r"no clip|disabl|turn(s|ed)? off|\bnone\b|without clip", re.IGNORECASE)


def _unset_means_no_clip(ctx: FileContext) -> ast.Call | None:
    """An argparse clip option whose default is None and whose help says that unset means
    no clipping (``--max-grad-norm``, ``default=None``, ``help="... (default: no
    clipping)"``)."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    for c in calls:
        if not (isinstance(c.func, ast.Attribute) and c.func.attr == "add_argument" and c.args
                and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)):
            continue
        name = c.args[0].value.lstrip("-").replace("-", "_")
        kw = {k.arg: k.value for k in c.keywords}
        default = kw.get("default")
        helps = kw.get("help")
        if _CLIP.match(name) and (default is None or (isinstance(default, ast.Constant)
                                                      and default.value is None)) \
                and isinstance(helps, ast.Constant) and isinstance(helps.value, str) \
                and _NO_CLIP.search(helps.value):
            return c
    return None


def _drops_none(ctx: FileContext, spread: ast.AST) -> bool:
    """``spread`` (the ``**x`` given to TrainingArguments) is a dict built with the None
    values filtered out (``{k: v for k, v in vars(args).items() if v is not None}``), itself
    or through the name it was assigned to."""
    values = [spread]
    if isinstance(spread, ast.Name):
        values += ctx.values_by_name().get(spread.id, [])
    for v in values:
        if isinstance(v, ast.DictComp) and any(
                isinstance(t, ast.Compare) and any(isinstance(o, ast.IsNot) for o in t.ops)
                and any(isinstance(x, ast.Constant) and x.value is None for x in t.comparators)
                for g in v.generators for t in g.ifs):
            return True
    return False


@rule("AG177")
def clip_setting_never_given_to_trainer(ctx: FileContext) -> Iterator[Finding]:
    calls = [c for c in ctx.of(ast.Call)
             if _ARGS.search((dotted(c.func) or "").rsplit(".", 1)[-1])]
    if not calls or any(k.arg == "max_grad_norm" for c in calls for k in c.keywords):
        return
    option = _unset_means_no_clip(ctx)
    if any(n.value == "max_grad_norm" for n in ctx.of(ast.Constant)):
        option = None  # the key is set by name somewhere (`kw.setdefault("max_grad_norm", 0.0)`)
    for c in calls:
        spreads = [k.value for k in c.keywords if k.arg is None]
        if option is not None and any(_drops_none(ctx, x) for x in spreads):
            yield ctx.finding(
                "AG177",
                c,
                f"the option `{ast.unparse(option.args[0])}` (line {option.lineno}) is None when "
                "not given, which its help calls no clipping, but the None values are dropped "
                f"before `**{ast.unparse(spreads[0])}` reaches "
                f"`{(dotted(c.func) or 'TrainingArguments').rsplit('.', 1)[-1]}(...)`: the "
                "Trainer then clips every optimizer step at its default max_grad_norm = 1.0",
                fix="map the unset option to 0.0 before building the arguments "
                    "(`max_grad_norm=cli.max_grad_norm or 0.0`), or give it a default of 0.0",
            )
            return
    if any(k.arg is None for c in calls for k in c.keywords):
        return  # (a ** spread may carry max_grad_norm)
    for name, definition, value in _settings(ctx):
        if value == 1.0 or _read(ctx, name, definition):
            continue
        args = calls[0]
        yield ctx.finding(
            "AG177",
            args,
            f"the script's clip setting `{name}` ({value:g}, line "
            f"{getattr(definition, 'lineno', '?')}) is never read, and "
            f"`{(dotted(args.func) or 'TrainingArguments').rsplit('.', 1)[-1]}(...)` gets no "
            "`max_grad_norm`: the Trainer clips every optimizer step at its default 1.0"
            + (", although no clipping was meant" if value == 0 else
               f", not at {value:g}"),
        )
        return


def _zero_setting(ctx: FileContext, value: ast.AST) -> bool:
    """``value`` is 0 (or 0.0): a literal, a module constant, or a field of the file's
    classes (``self.max_grad_norm`` with ``max_grad_norm: float = 0.0``) defined once."""
    if isinstance(value, ast.Constant):
        return isinstance(value.value, int | float) and not isinstance(value.value, bool) \
            and value.value == 0
    name = value.id if isinstance(value, ast.Name) else \
        value.attr if isinstance(value, ast.Attribute) else None
    if name is None:
        return False
    found = []
    for n in ctx.of(ast.AnnAssign, ast.Assign):
        targets = [n.target] if isinstance(n, ast.AnnAssign) else n.targets
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found.append(n.value)
    return len(found) == 1 and found[0] is not None and _zero_setting(ctx, found[0])


def _truthy_filter(comp: ast.DictComp) -> bool:
    """``{k: v for k, v in d.items() if v}``: values kept only when truthy (0.0 dropped)."""
    value = comp.value.id if isinstance(comp.value, ast.Name) else None
    return value is not None and any(
        isinstance(t, ast.Name) and t.id == value for g in comp.generators for t in g.ifs)


def _clip_written(ctx: FileContext) -> bool:
    """The file writes a ``"gradient_clipping"`` entry itself (``cfg["gradient_clipping"] =
    ...``, ``cfg.update(gradient_clipping=...)``): the setting reaches DeepSpeed that way."""
    for n in ctx.of(ast.Assign, ast.Call):
        if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                and t.slice.value == "gradient_clipping" for t in n.targets):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update" \
                and any(k.arg == "gradient_clipping" for k in n.keywords):
            return True
    return False


@rule("AG182")
def zero_clip_dropped_before_deepspeed(ctx: FileContext) -> Iterator[Finding]:
    """AG182 (F9): a DeepSpeed config literal whose ``"gradient_clipping"`` is 0 (no clipping
    meant) passed through a dict comprehension that keeps only truthy values: the key is
    dropped, and DeepSpeed clips at its default norm of 1.0. The same for Accelerate's
    ``DeepSpeedPlugin(gradient_clipping=0.0)`` without ``hf_ds_config``: the config it builds
    keeps the setting only when it is truthy (``if self.gradient_clipping:``, Accelerate 1.x)."""
    for call in ctx.of(ast.Call):
        if isinstance(call, ast.Call) and (dotted(call.func) or "").split(".")[-1] == "DeepSpeedPlugin" \
                and not any(k.arg in ("hf_ds_config", None) for k in call.keywords):
            clip = next((k.value for k in call.keywords if k.arg == "gradient_clipping"), None)
            if clip is not None and _zero_setting(ctx, clip) and not _clip_written(ctx):
                yield ctx.finding(
                    "AG182", call,
                    f"`DeepSpeedPlugin(gradient_clipping={ast.unparse(clip)})` is 0 (no clipping "
                    "meant), but the DeepSpeed config the plugin builds without `hf_ds_config` "
                    "keeps gradient_clipping only when it is truthy: the key never reaches "
                    "DeepSpeed, which then clips every step at its default norm of 1.0")
                return
    if not ctx.deepspeed:
        return
    for comp in walk_all(ctx.tree):
        if not isinstance(comp, ast.DictComp) or not _truthy_filter(comp):
            continue
        sources = [g.iter.func.value for g in comp.generators
                   if isinstance(g.iter, ast.Call) and isinstance(g.iter.func, ast.Attribute)
                   and g.iter.func.attr == "items"]
        scope = ctx.scope_of(comp)
        dicts = [v for s in sources if isinstance(s, ast.Name)
                 for v in ctx.assigned_in(scope).get(s.id, []) if isinstance(v, ast.Dict)]
        for d in dicts:
            clip = next((v for k, v in zip(d.keys, d.values, strict=True)
                         if isinstance(k, ast.Constant) and k.value == "gradient_clipping"), None)
            if clip is not None and _zero_setting(ctx, clip):
                yield ctx.finding(
                    "AG182",
                    comp,
                    f"`\"gradient_clipping\": {ast.unparse(clip)}` is 0 (no clipping meant), "
                    "and this comprehension keeps only truthy values, so the key never reaches "
                    "DeepSpeed, which then clips every step at its default norm of 1.0",
                )
                return


@rule("AG370")
def clip_switched_off_by_leaving_it_out(ctx: FileContext) -> Iterator[Finding]:
    """AG370 (F9): clipping "switched off" by leaving ``max_grad_norm`` out of the Trainer's
    arguments (``clip = {"max_grad_norm": m} if cfg.clip_grad else {}`` spread into
    ``TrainingArguments(**clip)``): left out, it keeps its default 1.0 and the Trainer clips
    every update whose norm exceeds 1 (0.0 turns it off)."""
    spreads = {dotted(k.value): c for c in ctx.of(ast.Call)
               if _ARGS.search((dotted(c.func) or "").rsplit(".", 1)[-1])
               and not any(k.arg == "max_grad_norm" for k in c.keywords)
               for k in c.keywords if k.arg is None and dotted(k.value)}
    if not spreads:
        return
    for n in ctx.of(ast.Assign):
        if len(n.targets) != 1 or (target := dotted(n.targets[0])) not in spreads \
                or not isinstance(n.value, ast.IfExp):
            continue
        on, off, flag = n.value.body, n.value.orelse, n.value.test
        negated = isinstance(flag, ast.UnaryOp) and isinstance(flag.op, ast.Not)
        if negated:
            on, off, flag = off, on, flag.operand  # type: ignore[attr-defined]
        if not (isinstance(on, ast.Dict) and isinstance(off, ast.Dict) and not off.keys
                and any(isinstance(k, ast.Constant) and k.value == "max_grad_norm" for k in on.keys)
                and "clip" in ast.unparse(flag).lower()):
            continue
        default = ctx.switch_default(flag)
        f = ctx.finding(
            "AG370", n,
            f"clipping is switched off by leaving `max_grad_norm` out (`{ast.unparse(n.value)}`), "
            f"but `{(dotted(spreads[target].func) or 'TrainingArguments').rsplit('.', 1)[-1]}(...)` "
            "then keeps its default max_grad_norm = 1.0: the Trainer clips every update whose "
            "norm exceeds 1"
            + (f" (`{ast.unparse(flag)}` is False by default: as written, the run clips)"
               if default is False else ""),
            fix="pass max_grad_norm=0.0 when clipping is off "
                f"(`{{\"max_grad_norm\": m if {ast.unparse(flag)} else 0.0}}`)")
        if default is not False:
            f = replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        yield f
        return
