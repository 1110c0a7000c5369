"""AG187 (F1): a command-line accumulation option that never reaches the config object.
AG191 (F1): an accumulation key ``HfArgumentParser.parse_dict(..., allow_extra_keys=True)``
drops because it is not a ``TrainingArguments`` field.
AG347 (F1): a config dataclass filtered to a constructor's signature
(``inspect.signature(pl.Trainer.__init__).parameters``) whose accumulation field is named
otherwise than the constructor's keyword: dropped, K stays 1.

A script parses ``--gradient-accumulation-steps`` with argparse and builds its config
dataclass from the parsed options filtered to the dataclass's fields
(``Config(**{k: v for k, v in vars(args).items() if k in fields})``). When the dataclass
names its accumulation field otherwise (``grad_accum``), the option's key is filtered out
without a word, and the field keeps its own default: with a default of 1 the run does not
accumulate at all and the optimizer steps on every micro-batch, whatever the command line
says. The filter must drop unknown keys (the constructor would raise on them), so a key
that is not a field never reaches it. Not reported when the option is also read directly
(``args.gradient_accumulation_steps`` anywhere in the file). An error when the field's default is 1 and the
option's default is larger; a warning when the option differs only when it is given.

AG191: ``HfArgumentParser(TrainingArguments).parse_dict(settings, allow_extra_keys=True)``
ignores the keys no dataclass field takes. A settings dict spelling the accumulation key
otherwise (``"gradient_accumulation": 4``, ``"grad_accum_steps"``) and never as
``gradient_accumulation_steps`` leaves the Trainer's default, 1: no accumulation.

AG326 (F9, a warning): the same parse spelling the clip setting otherwise (DeepSpeed's
``"gradient_clipping": 0.0``, ``"grad_clip"``) and never as ``max_grad_norm``: the Trainer
keeps its default clip at 1.0, which changes every update whose norm exceeds 1 (how often
is the run's: ``watch`` makes it an error when it sees that clip act).

AG328 (F9, a warning): settings (a dataclass field's default, a dict literal) setting
``max_grad_norm`` to ``None`` or ``0.0`` (the values that turn the Trainer's clipping off),
handed to ``TrainingArguments(**kwargs)`` through a filter dropping them (``{k: v for k, v in
asdict(cfg).items() if v is not None}`` drops None; ``... if v`` drops 0.0 too): the key
never arrives and the Trainer clips at its default 1.0. Not reported when the file sets the
key on the way (``kwargs["max_grad_norm"] = 0.0``, a ``max_grad_norm=`` keyword).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import ACCUM_RE, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["accumulation_field_dropped_by_signature_filter", "accumulation_key_dropped_by_parse_dict",
           "accumulation_option_dropped", "clip_none_dropped_by_filter"]


def _options(ctx: FileContext) -> list[tuple[ast.Call, str, object]]:
    """(call, dest, default) of every ``add_argument("--x-y", ...)`` whose dest names
    accumulation."""
    out: list[tuple[ast.Call, str, object]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) != "add_argument" or not call.args:
            continue
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        long = next((f for f in flags if f.startswith("--")), None)
        dest_kw = next((k.value for k in call.keywords if k.arg == "dest"), None)
        if isinstance(dest_kw, ast.Constant) and isinstance(dest_kw.value, str):
            dest = dest_kw.value
        elif long is not None:
            dest = long[2:].replace("-", "_")
        else:
            continue
        if not ACCUM_RE.search(dest.lower()):
            continue
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        value = default.value if isinstance(default, ast.Constant) else None
        out.append((call, dest, value))
    return out


def _fields(cls: ast.ClassDef) -> dict[str, object]:
    """A dataclass's fields and their literal defaults (None when not a literal)."""
    out: dict[str, object] = {}
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            out[st.target.id] = st.value.value if isinstance(st.value, ast.Constant) else None
    return out


def _dataclasses(ctx: FileContext) -> dict[str, ast.ClassDef]:
    return {c.name: c for c in ctx.of(ast.ClassDef) if isinstance(c, ast.ClassDef) and any(
        (dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith("dataclass")
        for d in c.decorator_list)}


def _filtered_options(ctx: FileContext, value: ast.AST) -> bool:
    """``value`` (or the one value of its name) is a dict comprehension over the parsed
    options (``vars(args).items()``, ``args.__dict__.items()``) with a condition."""
    if isinstance(value, ast.Name):
        values = ctx.assigned_in(ctx.scope_of(value)).get(value.id, [])
        value = values[0] if len(values) == 1 else value
    if not (isinstance(value, ast.DictComp) and len(value.generators) == 1):
        return False
    gen = value.generators[0]
    it = gen.iter
    if not (gen.ifs and isinstance(it, ast.Call) and call_attr(it) == "items"
            and isinstance(it.func, ast.Attribute)):
        return False
    src = it.func.value
    return (isinstance(src, ast.Call) and dotted(src.func) == "vars") or \
        (isinstance(src, ast.Attribute) and src.attr == "__dict__")


@rule("AG187")
def accumulation_option_dropped(ctx: FileContext) -> Iterator[Finding]:
    options = _options(ctx)
    if not options:
        return
    classes = _dataclasses(ctx)
    for call in ctx.of(ast.Call):
        cls = classes.get(dotted(call.func) or "")
        if cls is None and (dotted(call.func) or "").rsplit(".", 1)[-1] == "replace" \
                and call.args and isinstance(call.args[0], ast.Call):
            # dataclasses.replace(Config(), **overrides): the same filter into the fields
            cls = classes.get(dotted(call.args[0].func) or "")
        if cls is None or not any(k.arg is None and _filtered_options(ctx, k.value)
                                  for k in call.keywords):
            continue
        fields = _fields(cls)
        accum = [(n, d) for n, d in fields.items() if ACCUM_RE.search(n.lower())]
        if not accum:
            continue
        read = {a.attr for a in ctx.of(ast.Attribute) if isinstance(a, ast.Attribute)}
        for opt, dest, default in options:
            if dest in fields or dest in read:
                continue  # (a field of its own, or read from the options directly)
            field, field_default = accum[0]
            finding = ctx.finding(
                "AG187",
                opt,
                f"the option `{dest}` never reaches `{cls.name}`: its keys are filtered to the "
                f"dataclass's fields at line {call.lineno}, which has no `{dest}` (its "
                f"accumulation field is `{field}`), so `{field}` keeps its default "
                f"{field_default!r}"
                + (": the run does not accumulate, the optimizer steps on every micro-batch "
                   f"(the option's default is {default!r})"
                   if field_default == 1 and isinstance(default, int) and default > 1 else ""),
            )
            if not (field_default == 1 and isinstance(default, int) and default > 1):
                finding = replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
            yield finding
            return


_HF_FIELD = "gradient_accumulation_steps"


def _lenient_parses(ctx: FileContext) -> Iterator[tuple[ast.Call, list[ast.Constant]]]:
    """``parse_dict(<dict literal>, allow_extra_keys=True)`` calls with the dict's string keys."""
    for call in ctx.of(ast.Call):
        if call_attr(call) != "parse_dict" or not call.args or not any(
                k.arg == "allow_extra_keys" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in call.keywords):
            continue
        d = call.args[0]
        if isinstance(d, ast.Name):
            values = ctx.values_by_name().get(d.id, [])
            d = values[0] if len(values) == 1 else d
        if isinstance(d, ast.Dict):
            yield call, [k for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif (keys := _text_keys(ctx, d)) is not None:
            yield call, keys


_YAML_TOP_KEY = re.compile(r"^([A-Za-z_][\w.-]*)\s*:")


def _text_keys(ctx: FileContext, expr: ast.AST) -> list[ast.Constant] | None:
    """``yaml.safe_load(TEXT)`` / ``json.loads(TEXT)`` (``TEXT.format(...)`` too) with ``TEXT``
    a string the file binds once: its top-level keys, each as a constant at its line in the
    file (YAML read by its unindented ``key:`` lines, JSON parsed)."""
    if not (isinstance(expr, ast.Call) and expr.args
            and call_attr(expr) in ("safe_load", "load", "loads", "full_load")):
        return None
    text: ast.AST = expr.args[0]
    if isinstance(text, ast.Call) and call_attr(text) == "format" and isinstance(text.func, ast.Attribute):
        text = text.func.value
    if isinstance(text, ast.Name):
        values = ctx.values_by_name().get(text.id, [])
        text = values[0] if len(values) == 1 else text
    if not (isinstance(text, ast.Constant) and isinstance(text.value, str)):
        return None
    out: list[ast.Constant] = []
    for i, line in enumerate(text.value.splitlines()):
        m = _YAML_TOP_KEY.match(line) if "json" not in (dotted(expr.func) or "") else None
        if m is None and "json" in (dotted(expr.func) or ""):
            m = re.match(r'^\s{0,4}"([^"]+)"\s*:', line)  # a top-level JSON key, by its indent
        if m is not None:
            out.append(ast.Constant(m.group(1), lineno=text.lineno + i, col_offset=0,
                                    end_lineno=text.lineno + i, end_col_offset=len(line)))
    return out


_CLIP_KEY = re.compile(r"clip|max_norm")


@rule("AG326")
def clip_key_dropped_by_parse_dict(ctx: FileContext) -> Iterator[Finding]:
    for call, keys in _lenient_parses(ctx):
        if any(k.value == "max_grad_norm" for k in keys):
            continue
        odd = next((k for k in keys if _CLIP_KEY.search(str(k.value).lower())), None)
        if odd is None or any(odd.value in _fields(c) for c in _dataclasses(ctx).values()):
            continue
        f = ctx.finding(
            "AG326",
            odd,
            f"the settings key {odd.value!r} is no TrainingArguments field: "
            f"`{ast.unparse(call.func)}(..., allow_extra_keys=True)` (line {call.lineno}) drops "
            "it without a word, so max_grad_norm keeps its default 1.0 and the Trainer clips "
            "every update whose gradient norm exceeds 1")
        yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


@rule("AG191")
def accumulation_key_dropped_by_parse_dict(ctx: FileContext) -> Iterator[Finding]:
    for call, keys in _lenient_parses(ctx):
        if any(k.value == _HF_FIELD for k in keys):
            continue
        odd = next((k for k in keys if ACCUM_RE.search(str(k.value).lower())), None)
        if odd is None or any(odd.value in _fields(c) for c in _dataclasses(ctx).values()):
            continue  # (a dataclass of the file's own, parsed beside TrainingArguments, takes it)
        yield ctx.finding(
            "AG191",
            odd,
            f"the settings key {odd.value!r} is no TrainingArguments field: "
            f"`{ast.unparse(call.func)}(..., allow_extra_keys=True)` (line {call.lineno}) drops "
            f"it without a word, so gradient_accumulation_steps keeps its default 1 and the "
            "Trainer steps on every micro-batch",
        )


def _clip_settings(ctx: FileContext) -> list[tuple[ast.AST, object]]:
    """Where the file sets ``max_grad_norm`` to a literal: a dataclass field's default, a dict
    literal's entry; (the node, the value)."""
    out: list[tuple[ast.AST, object]] = []
    for c in _dataclasses(ctx).values():
        for st in c.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                    and st.target.id == "max_grad_norm" and isinstance(st.value, ast.Constant):
                out.append((st, st.value.value))
    for d in ctx.of(ast.Dict):
        for k, v in zip(d.keys, d.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "max_grad_norm" and isinstance(v, ast.Constant):
                out.append((v, v.value))
    return out


def _filter_kind(comp: ast.AST) -> str | None:
    """``{k: v for k, v in <x>.items() if v is not None}``: 'none'; ``... if v``: 'falsy'."""
    if not (isinstance(comp, ast.DictComp) and len(comp.generators) == 1):
        return None
    gen = comp.generators[0]
    value = comp.value.id if isinstance(comp.value, ast.Name) else None
    if value is None:
        return None
    for c in gen.ifs:
        if isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and c.left.id == value \
                and len(c.ops) == 1 and isinstance(c.ops[0], ast.IsNot) \
                and isinstance(c.comparators[0], ast.Constant) and c.comparators[0].value is None:
            return "none"
        if isinstance(c, ast.Name) and c.id == value:
            return "falsy"
    return None


def _dropped(kind: str, value: object) -> bool:
    return value is None or (kind == "falsy" and not value)


def _sets_clip(ctx: FileContext, scope: ast.AST) -> bool:
    """The scope writes ``max_grad_norm`` into a mapping (``kw["max_grad_norm"] = ...``,
    ``kw.setdefault("max_grad_norm", ...)``, ``kw.update(max_grad_norm=...)``)."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value == "max_grad_norm" and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Call) and call_attr(node) in ("setdefault", "update") and (
                any(isinstance(a, ast.Constant) and a.value == "max_grad_norm" for a in node.args)
                or any(k.arg == "max_grad_norm" for k in node.keywords)):
            return True
    return False


#: TRL's configs subclass TrainingArguments (max_grad_norm and its default 1.0 included)
_TRL_CONFIGS = frozenset({"SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig", "KTOConfig",
                          "ORPOConfig", "PPOConfig", "RLOOConfig", "CPOConfig"})


@rule("AG328")
def clip_none_dropped_by_filter(ctx: FileContext) -> Iterator[Finding]:
    settings = _clip_settings(ctx)
    if not settings:
        return
    for call in ctx.of(ast.Call):
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if not (name.endswith("TrainingArguments") or name in _TRL_CONFIGS):
            continue
        if any(k.arg == "max_grad_norm" for k in call.keywords):
            continue
        for k in call.keywords:
            if k.arg is not None:
                continue
            value: ast.AST = k.value
            scope = ctx.scope_of(call)
            if isinstance(value, ast.Name):
                values = ctx.assigned_in(scope).get(value.id, [])
                value = values[0] if len(values) == 1 else value
            kind = _filter_kind(value)
            if kind is None or _sets_clip(ctx, scope):
                continue
            hit = next(((node, v) for node, v in settings if _dropped(kind, v)), None)
            if hit is None:
                continue
            node, v = hit
            what = ("the None values" if kind == "none" else
                    "the values that test false (None, 0, 0.0)")
            f = ctx.finding(
                "AG328",
                call,
                f"`max_grad_norm` is {v!r} in the settings (line {getattr(node, 'lineno', '?')}), the value that "
                f"turns the Trainer's clipping off, but {what} are filtered out before "
                f"`{name}(**...)` (line {call.lineno}): the key never arrives, max_grad_norm "
                "keeps its default 1.0 and the Trainer clips every update whose gradient norm "
                "exceeds 1")
            yield replace(f, confidence=Confidence.MEDIUM)
            return


#: what each constructor calls its accumulation count
_TARGET_KEYS = {"Trainer": "accumulate_grad_batches", "TrainingArguments": _HF_FIELD,
                "Accelerator": _HF_FIELD, "SFTConfig": _HF_FIELD, "DPOConfig": _HF_FIELD,
                "GRPOConfig": _HF_FIELD}


def _signature_target(ctx: FileContext, accepted: ast.AST) -> str | None:
    """The constructor whose ``inspect.signature(X).parameters`` (or ``X.__init__``) the
    name ``accepted`` holds (its one value in its scope)."""
    if isinstance(accepted, ast.Name):
        values = ctx.assigned_in(ctx.scope_of(accepted)).get(accepted.id, [])
        accepted = values[0] if len(values) == 1 else accepted
    if not (isinstance(accepted, ast.Attribute) and accepted.attr == "parameters"
            and isinstance(sig := accepted.value, ast.Call) and call_attr(sig) == "signature"
            and sig.args):
        return None
    target = dotted(sig.args[0]) or ""
    return target.removesuffix(".__init__").rsplit(".", 1)[-1]


@rule("AG347")
def accumulation_field_dropped_by_signature_filter(ctx: FileContext) -> Iterator[Finding]:
    """A config dataclass turned into a constructor's keyword arguments by keeping only the
    keys its signature takes (``{k: v for k, v in asdict(cfg).items() if k in
    inspect.signature(pl.Trainer.__init__).parameters}``), whose accumulation field is named
    otherwise (``grad_accum_steps``): it is dropped without a word and the constructor keeps
    its default of 1, unless the file passes the constructor's own key explicitly."""
    classes = _dataclasses(ctx)
    if not classes:
        return
    for comp in ast.walk(ctx.tree):
        if not isinstance(comp, ast.DictComp) or len(comp.generators) != 1 \
                or not comp.generators[0].ifs:
            continue
        gen = comp.generators[0]
        test = gen.ifs[0]
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], ast.In)):
            continue
        target = _signature_target(ctx, test.comparators[0])
        key = _TARGET_KEYS.get(target or "")
        if key is None or not (isinstance(gen.iter, ast.Call) and call_attr(gen.iter) == "items"
                               and isinstance(gen.iter.func, ast.Attribute)
                               and isinstance(gen.iter.func.value, ast.Call)
                               and (dotted(gen.iter.func.value.func) or "").rsplit(".", 1)[-1]
                               == "asdict"):
            continue
        fields = {f: d for c in classes.values() for f, d in _fields(c).items()}
        if key in fields:
            continue
        named = [(f, d) for f, d in fields.items() if ACCUM_RE.search(f)]
        if len(named) != 1:
            continue
        field, default = named[0]
        if not (isinstance(default, int) and default > 1):
            continue
        if any(isinstance(c, ast.Constant) and c.value == key for c in ctx.of(ast.Constant)) \
                or any(k.arg == key for call in ctx.of(ast.Call) for k in call.keywords):
            continue  # the key is passed by name somewhere: mapped by hand
        yield ctx.finding(
            "AG347", comp,
            f"only the keys `{target}`'s signature takes are kept, and the config's "
            f"accumulation field is `{field}` (default {default}), not `{key}`: it is dropped "
            f"without a word and `{target}` keeps {key}=1, so the optimizer steps on every "
            "micro-batch")
