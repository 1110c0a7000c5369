"""Which DeepSpeed config a script uses, read statically: a ``.json`` path literal next to
the script, or a dict literal / ``dict(...)`` handed to DeepSpeed.

Split from :mod:`._context` (the per-file facts); :class:`FileContext` creates one
:class:`DsConfigFinder` on first use. A literal becomes a :class:`~accumguard.static.dsconfig.ConfigDict`
with each key's line, ``UNKNOWN`` for computed values and ``partial`` for ``**spread``,
so the AG2xx checks can run on it as on a file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from accumguard.static import dsconfig
from accumguard.static.lint._ast import call_attr, dotted, last_part, receiver, walk_local
from accumguard.static.lint._dslaunch import launcher_configs
from accumguard.static.lint._dsresolve import (
    NameResolver,
    config_from_literal,
    dataclass_classes,
    literal_keys,
    literal_value,
)


class FileFacts(Protocol):
    """What the finder reads of a file's context (:class:`._context.FileContext` has it);
    a protocol so that this module does not import the context that creates it."""

    @property
    def tree(self) -> ast.AST: ...  # read-only: FileContext's is an ast.Module

    path: Path | None
    parents: dict[ast.AST, ast.AST]
    deepspeed: bool

    def of(self, *types: type) -> list[Any]: ...

    def is_training_script(self) -> bool: ...

    def _cached(self, kind: str, node: ast.AST, compute: Any) -> Any: ...

_DS_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_DS_CONFIG_NAME = re.compile(r"ds_?conf|deepspeed_?conf|ds_?cfg|zero_?conf")
_CONFIG_KEYWORDS = frozenset(
    {"config", "config_params", "ds_config", "deepspeed", "hf_ds_config", "deepspeed_config"}
)
_MAX_JSON_CANDIDATES = 32  # string literals naming a .json file tried
#: an update call made in another scope than the config's: never applied (the config is partial)
_NEVER_APPLIED = ast.Call(func=ast.Name("update"), args=[], keywords=[], lineno=10**9)
#: a binding that is not one plain assignment (a tuple target, ``+=``): not a literal
_OPAQUE = ast.Assign(targets=[], value=ast.Constant(None), lineno=0)


@dataclass(frozen=True)
class DsConfigRef:
    """The DeepSpeed config a script uses, as far as it can be read statically."""

    cfg: dsconfig.ConfigDict
    where: str  # "ds_config.json:4" or "dict literal at line 12"
    node: ast.AST  # the string literal or the dict
    literal: bool  # written in the script (its findings belong to the script)
    hf: bool = False  # handed to the Hugging Face Trainer (TrainingArguments(deepspeed=...))
    name: str | None = None  # the variable the config is assigned to (``cfg = {...}``/``json.load``)

    @property
    def ga(self) -> int | None:
        """GA for AG109/AG110: None when absent and not derivable (DeepSpeed then uses 1)."""
        return dsconfig.resolved_accumulation_steps(self.cfg)

    @property
    def stage(self) -> int | None:
        return dsconfig.zero_stage(self.cfg)

    @property
    def managed(self) -> bool | None:
        return dsconfig.managed_accumulation(self.cfg)


class DsConfigFinder:
    """Finds the DeepSpeed config(s) of one file; answers cached in the file's context."""

    def __init__(self, ctx: FileFacts) -> None:
        self.ctx = ctx

    def ds_config(self) -> DsConfigRef | None:
        """The DeepSpeed config the script names (a .json path literal or a dict literal)."""
        return self.ctx._cached("ds_config", self.ctx.tree, self._find_ds_config)  # type: ignore[no-any-return]

    def ds_config_literals(self) -> list[DsConfigRef]:
        """Every dict literal (or ``dict(...)`` call) in the script that is a DeepSpeed config."""
        return self.ctx._cached("ds_literals", self.ctx.tree, self._ds_literals)  # type: ignore[no-any-return]

    def _ds_literals(self) -> list[DsConfigRef]:
        out: list[DsConfigRef] = []
        candidates: list[ast.AST] = list(self.ctx.of(ast.Dict))
        candidates += [c for c in self.ctx.of(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == "dict" and c.keywords]
        for node in candidates:
            parent = self.ctx.parents.get(node)
            if isinstance(parent, ast.Dict) or (
                isinstance(parent, ast.keyword)
                and isinstance(grand := self.ctx.parents.get(parent), ast.Call)
                and dotted(grand.func) == "dict"
            ):
                continue  # a nested section: read with its parent
            keys = literal_keys(node)
            spread = (isinstance(node, ast.Dict) and None in node.keys) or (isinstance(node, ast.Call) and (
                bool(node.args) or any(k.arg is None for k in node.keywords)))
            if not (set(keys) & set(_DS_BATCH_KEYS) or "zero_optimization" in keys or spread):
                continue
            if not self._used_as_config(node):
                continue  # a template or a fragment (library code), not a config
            resolver = self.resolver()
            cfg = config_from_literal(resolver.with_own_fields(node), resolve=resolver.resolve)
            if cfg is None or not (set(cfg) & set(_DS_BATCH_KEYS) or "zero_optimization" in cfg):
                continue  # `{**base}` whose base cannot be read, or is no DeepSpeed config
            name = self._holder_name(node)
            if name is not None:
                self._apply_later_updates(name, cfg, node)
            out.append(DsConfigRef(cfg, f"dict literal at line {getattr(node, 'lineno', 1)}", node, literal=True,
                                   hf=self._handed_to_hf(node), name=name))
        out += self._dataclass_configs()
        out += self._text_configs()
        return out + self._resolved_arguments({id(r.node) for r in out})

    def _text_configs(self) -> list[DsConfigRef]:
        """A config written as JSON text in the script and parsed there
        (``cfg = json.loads(DS_JSON)`` with ``DS_JSON = \"\"\"{...}\"\"\"``): read as DeepSpeed
        reads a file."""
        out: list[DsConfigRef] = []
        resolver = self.resolver()
        for call in self.ctx.of(ast.Call):
            if call_attr(call) != "loads" or len(call.args) != 1 \
                    or (dotted(call.func) or "").split(".")[0] not in ("json", "hjson", "json5"):
                continue
            text = call.args[0]
            if isinstance(text, ast.Name) and (bound := resolver.binding(text)) is not None:
                text = bound[1].value
            if not (isinstance(text, ast.Constant) and isinstance(text.value, str)) or len(text.value) > 100_000:
                continue
            try:
                cfg = dsconfig.parse_config_text(text.value)
            except ValueError:
                continue
            if not (set(cfg) & set(_DS_BATCH_KEYS) or "zero_optimization" in cfg):
                continue
            # (its key lines counted in the script, as a dict literal's are)
            cfg.key_lines = {k: text.lineno + line - 1 for k, line in cfg.key_lines.items()}
            name = self._holder_name(call)
            if name is not None:
                self._apply_later_updates(name, cfg, call)
            out.append(DsConfigRef(cfg, f"JSON text at line {text.lineno}", call, literal=True,
                                   hf=self._handed_to_hf(call), name=name))
        return out

    def _resolved_arguments(self, found: set[int]) -> list[DsConfigRef]:
        """A config handed to DeepSpeed as an expression no literal above stands for
        (``config=cfg`` with ``cfg = copy.deepcopy(BASE)`` then ``cfg["key"] = ...``,
        ``config=make()`` returning such a name, ``config=cfg["ds"]`` with ``cfg`` a
        parameter its one caller gives), read by the resolver when it leads to dict
        literals of the file."""
        out: list[DsConfigRef] = []
        resolver = self.resolver()
        # `config=` is a common keyword: only in a file that uses DeepSpeed, or under a name
        # that says DeepSpeed (`TrainingArguments(deepspeed=...)`, `hf_ds_config=`)
        args: list[ast.AST] = [kw.value for kw in self._config_keywords()
                               if self.ctx.deepspeed or kw.arg not in ("config", "config_params")]
        args += [a for c in self.ctx.of(ast.Call) if call_attr(c) == "initialize" and self.ctx.deepspeed
                 for a in c.args]
        for arg in args:
            keyed = isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant) \
                and isinstance(arg.slice.value, str)  # `config=cfg["ds"]`
            field = isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)  # `cfg.ds`
            if not (isinstance(arg, ast.Name | ast.Call) or keyed or field) or self._root_literal(arg) in found:
                continue
            if isinstance(arg, ast.Call) and (last_part(dotted(arg.func)) in ("load", "loads") or (
                    last_part(dotted(arg.func)) == "asdict" and id(arg) in found)):
                continue  # a file (read above by its path) or a dataclass read above (not a
                # field of one: `asdict(cfg.engine)` is read here)
            cfg = resolver.resolve(arg)
            if cfg is None or not (set(cfg) & set(_DS_BATCH_KEYS) or "zero_optimization" in cfg):
                continue
            found.add(id(arg))
            out.append(DsConfigRef(cfg, f"config built at line {getattr(arg, 'lineno', 1)}", arg, literal=True,
                                   hf=self._handed_to_hf(arg), name=dotted(arg) if isinstance(arg, ast.Name) else None))
        return out

    def _root_literal(self, expr: ast.AST) -> int:
        """The id of the node a config expression stands for: a name's one binding value, a
        call's function's one return value, followed a few steps (else the expression)."""
        resolver = self.resolver()
        for _ in range(4):
            nxt: ast.AST | None = None
            if isinstance(expr, ast.Name) and (bound := resolver.binding(expr)) is not None:
                nxt = bound[1].value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) \
                    and (fn := self._function(expr.func.id)) is not None:
                rets = [n for n in walk_local(fn) if isinstance(n, ast.Return)]
                nxt = rets[0].value if len(rets) == 1 else None
            if nxt is None:
                break
            expr = nxt
        return id(expr)

    def _dataclass_configs(self) -> list[DsConfigRef]:
        """``asdict(DSConfig(...))`` (or ``asdict(cfg)``, ``cfg`` bound once to such a call)
        handed to DeepSpeed, ``DSConfig`` a ``@dataclass`` of the file: its fields' defaults
        (``field(default=...)``, ``default_factory=lambda: {...}``, a nested dataclass) with the
        call's keywords over them, read as a dict literal at the fields' lines."""
        classes = self._classes()
        out: list[DsConfigRef] = []
        if not classes:
            return out
        resolver = self.resolver()
        for call in self.ctx.of(ast.Call):
            if last_part(dotted(call.func)) != "asdict" or len(call.args) != 1:
                continue
            inner: ast.AST = call.args[0]
            if isinstance(inner, ast.Name) and (bound := resolver.binding(inner)) is not None:
                inner = bound[1].value
            if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name)):
                continue
            cls = classes.get(inner.func.id)
            if cls is None or not self._used_as_config(call):
                continue
            cfg = resolver.resolve(call.args[0])
            if cfg is None or not (set(cfg) & set(_DS_BATCH_KEYS) or "zero_optimization" in cfg):
                continue
            out.append(DsConfigRef(cfg, f"dataclass {cls.name} at line {cls.lineno}", call, literal=True,
                                   hf=self._handed_to_hf(call), name=None))
        return out

    def _classes(self) -> dict[str, ast.ClassDef]:
        return self.ctx._cached(  # type: ignore[no-any-return]
            "ds_dataclasses", self.ctx.tree, lambda: dataclass_classes(self.ctx.of(ast.ClassDef)))

    def resolver(self) -> NameResolver:
        """The file's reader of config sections given by name (:mod:`._dsresolve`)."""
        return self.ctx._cached(  # type: ignore[no-any-return]
            "ds_resolver", self.ctx.tree,
            lambda: NameResolver(self.ctx.parents, self.ctx.tree, self._classes(), self._scope_assigns,
                                 self._scope_updates, self._scope_subscripts, self._function))

    def _function(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The file's only module-level-or-nested function ``name`` (not a method)."""
        def compute() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
            defs = self._defs_and_calls_by_name()[0]
            return {f.name: f for f in self.ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)
                    if defs.get(f.name, 0) == 1 and not isinstance(self.ctx.parents.get(f), ast.ClassDef)}
        table: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = self.ctx._cached("ds_functions", self.ctx.tree, compute)
        return table.get(name)

    def _scope_subscripts(self, scope: ast.AST) -> dict[str, list[ast.Assign]]:
        """Per plain name, its ``name["key"] = value`` statements in ``scope``."""
        def compute() -> dict[str, list[ast.Assign]]:
            out: dict[str, list[ast.Assign]] = {}
            for n in walk_local(scope):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                            out.setdefault(t.value.id, []).append(n)
            return out
        return self.ctx._cached("ds_scope_subs", scope, compute)  # type: ignore[no-any-return]

    def _scope_assigns(self, scope: ast.AST) -> dict[str, list[ast.Assign]]:
        """Per plain name, its assignments in ``scope`` (outside nested definitions)."""
        def compute() -> dict[str, list[ast.Assign]]:
            out: dict[str, list[ast.Assign]] = {}
            for n in walk_local(scope):
                if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        for x in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                            if isinstance(x, ast.Name):
                                # a tuple target or an augmented assignment: not one literal
                                single = isinstance(n, ast.Assign | ast.AnnAssign) and x is t and n.value is not None
                                out.setdefault(x.id, []).append(n if single else _OPAQUE)  # type: ignore[arg-type]
            return out
        return self.ctx._cached("ds_scope_assigns", scope, compute)  # type: ignore[no-any-return]

    def _scope_updates(self, scope: ast.AST) -> dict[str, list[ast.Call]]:
        """Per plain name, its ``.update()``/``.setdefault()`` calls in ``scope``; a name updated
        in another scope too gets a marker call that never applies (the config is partial)."""
        def compute() -> dict[str, list[ast.Call]]:
            out: dict[str, list[ast.Call]] = {}
            for n in walk_local(scope):
                if (isinstance(n, ast.Call) and call_attr(n) in ("update", "setdefault")
                        and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)):
                    out.setdefault(n.func.value.id, []).append(n)
            totals = self._update_counts()
            for name, calls in out.items():
                if totals.get(name, 0) > len(calls):
                    calls.append(_NEVER_APPLIED)
            return out
        return self.ctx._cached("ds_scope_updates", scope, compute)  # type: ignore[no-any-return]

    def _update_counts(self) -> dict[str, int]:
        """How many ``.update()``/``.setdefault()`` calls each name receives in the whole file."""
        def compute() -> dict[str, int]:
            out: dict[str, int] = {}
            for c in self.ctx.of(ast.Call):
                if call_attr(c) in ("update", "setdefault") and (d := dotted(receiver(c))) is not None:
                    out[d] = out.get(d, 0) + 1
            return out
        return self.ctx._cached("ds_update_counts", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _is_config_argument(self, node: ast.AST) -> bool:
        parent = self.ctx.parents.get(node)
        if isinstance(parent, ast.keyword):
            return parent.arg in _CONFIG_KEYWORDS
        return isinstance(parent, ast.Call) and last_part(dotted(parent.func)) == "initialize" and self.ctx.deepspeed

    def _used_as_config(self, node: ast.AST) -> bool:
        """The dict is handed to DeepSpeed: ``initialize(config=<it>)``, ``TrainingArguments(
        deepspeed=<it>)``, ``DeepSpeedPlugin(hf_ds_config=<it>)``, directly or through the name
        it is assigned to, or it is a ``ds_config = {...}`` of a training script."""
        if self._is_config_argument(node):
            return True
        parent = self.ctx.parents.get(node)
        if isinstance(parent, ast.Return):
            return self._returned_as_config(parent)
        if not isinstance(parent, ast.Assign | ast.AnnAssign):
            return False
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        names = {d for d in (dotted(t) for t in targets) if d}
        if names & self._config_argument_names():
            return True
        if (ret := self._returned_name(parent, names)) is not None and self._returned_as_config(ret):
            return True  # `cfg = {...}; cfg.update(...); return cfg` in a builder handed over
        if self.ctx.deepspeed and self._dumped_as_json(parent, names):
            return True  # written to the JSON file `initialize(config=path)` reads
        return self._assigned_to_config_name(node) and self.ctx.is_training_script()

    def _dumped_as_json(self, stmt: ast.AST, names: set[str]) -> bool:
        """One of ``names`` is written as JSON (``json.dump(cfg, f)``) in the function around
        ``stmt``, in a file whose ``deepspeed.initialize`` is given a config that is no
        literal (a path): the file it writes is that config."""
        fn: ast.AST | None = self.ctx.parents.get(stmt)
        while fn is not None and not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            fn = self.ctx.parents.get(fn)
        dumps = self._json_dumps()
        return any((fn or self.ctx.tree, n) in dumps for n in names) and self._path_config()

    def _json_dumps(self) -> set[tuple[ast.AST, str]]:
        """(enclosing function or the module, dotted name) of every ``json.dump(name, ...)``
        of the file (once per file: every dict literal asks)."""
        def compute() -> set[tuple[ast.AST, str]]:
            out: set[tuple[ast.AST, str]] = set()
            for n in self.ctx.of(ast.Call):
                if call_attr(n) in ("dump", "dumps") and n.args \
                        and (dotted(n.func) or "").split(".")[0] in ("json", "hjson", "json5") \
                        and (d := dotted(n.args[0])) is not None:
                    scope: ast.AST | None = self.ctx.parents.get(n)
                    while scope is not None and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                        scope = self.ctx.parents.get(scope)
                    out.add((scope or self.ctx.tree, d))
            return out
        return self.ctx._cached("json_dumps", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _path_config(self) -> bool:
        """``initialize`` is given a config that is no dict literal somewhere in the file."""
        return self.ctx._cached("ds_path_config", self.ctx.tree, lambda: any(  # type: ignore[no-any-return]
            call_attr(c) == "initialize" and any(k.arg in ("config", "config_params")
                                                 and not isinstance(k.value, ast.Dict)
                                                 for k in c.keywords)
            for c in self.ctx.of(ast.Call)))

    def _returned_name(self, stmt: ast.AST, names: set[str]) -> ast.Return | None:
        """The only ``return`` of the function around ``stmt`` when it returns one of ``names``."""
        fn = self.ctx.parents.get(stmt)
        while fn is not None and not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            fn = self.ctx.parents.get(fn)
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        rets = [n for n in walk_local(fn) if isinstance(n, ast.Return)]
        if len(rets) == 1 and rets[0].value is not None and dotted(rets[0].value) in names:
            return rets[0]
        return None

    def _returned_as_config(self, ret: ast.Return) -> bool:
        """``def ds_config(world): return {...}`` (its only return) and a call of it handed to
        DeepSpeed: ``initialize(config=ds_config(world))``, or ``cfg = ds_config(world)`` with
        ``cfg`` passed as the config."""
        fn = self.ctx.parents.get(ret)
        while fn is not None and not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            fn = self.ctx.parents.get(fn)
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return False
        if sum(isinstance(n, ast.Return) for n in ast.walk(fn)) != 1:
            return False
        defs, calls = self._defs_and_calls_by_name()
        if defs.get(fn.name, 0) != 1:
            return False  # two functions of that name: which one is called cannot be told
        if isinstance(self.ctx.parents.get(fn), ast.ClassDef):
            calls = {fn.name: self._method_calls_by_name().get(fn.name, [])}  # cfg.to_ds(world)
        for call in calls.get(fn.name, ()):
            if self._is_config_argument(call):
                return True
            parent = self.ctx.parents.get(call)
            if isinstance(parent, ast.Assign) and {d for t in parent.targets if (d := dotted(t))} \
                    & self._config_argument_names():
                return True
        return False

    def _defs_and_calls_by_name(self) -> tuple[dict[str, int], dict[str, list[ast.Call]]]:
        """How many functions of the file bear each name, and the calls ``name(...)`` by name:
        indexed once per file (a big file returns many dict literals)."""
        def compute() -> tuple[dict[str, int], dict[str, list[ast.Call]]]:
            defs: dict[str, int] = {}
            for d in self.ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
                defs[d.name] = defs.get(d.name, 0) + 1
            calls: dict[str, list[ast.Call]] = {}
            for call in self.ctx.of(ast.Call):
                if isinstance(call.func, ast.Name):
                    calls.setdefault(call.func.id, []).append(call)
            return defs, calls
        return self.ctx._cached("ds_defs_calls", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _method_calls_by_name(self) -> dict[str, list[ast.Call]]:
        """The calls ``obj.name(...)`` by method name, indexed once per file."""
        def compute() -> dict[str, list[ast.Call]]:
            calls: dict[str, list[ast.Call]] = {}
            for call in self.ctx.of(ast.Call):
                if isinstance(call.func, ast.Attribute):
                    calls.setdefault(call.func.attr, []).append(call)
            return calls
        return self.ctx._cached("ds_method_calls", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _config_argument_names(self) -> set[str]:
        """Names passed as a config: ``config=cfg`` keywords and ``initialize(..., cfg)``."""
        def compute() -> set[str]:
            out = {d for kw in self._config_keywords() if (d := dotted(kw.value))}
            for call in self.ctx.of(ast.Call):
                if call_attr(call) == "initialize":
                    out.update(d for a in call.args if (d := dotted(a)))
            return out
        return self.ctx._cached("config_names", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _updates_by_name(self) -> tuple[dict[str, list[ast.Assign]], set[str]]:
        """``name["key"] = value`` statements by name, and names with ``.update()``/``.setdefault()``."""
        def compute() -> tuple[dict[str, list[ast.Assign]], set[str]]:
            subs: dict[str, list[ast.Assign]] = {}
            for n in self.ctx.of(ast.Assign):
                for t in n.targets:
                    if (
                        isinstance(t, ast.Subscript)
                        and isinstance(t.slice, ast.Constant)
                        and isinstance(t.slice.value, str)
                        and (d := dotted(t.value))
                    ):
                        subs.setdefault(d, []).append(n)
            updated = {
                d for c in self.ctx.of(ast.Call)
                if call_attr(c) in ("update", "setdefault") and (d := dotted(receiver(c)))
            }
            return subs, updated
        return self.ctx._cached("updates", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _handed_to_hf(self, node: ast.AST) -> bool:
        """The dict goes to ``TrainingArguments(deepspeed=...)`` (directly or by name): the
        Trainer fills "auto" values and clips at its own max_grad_norm (1.0 by default)."""
        parent = self.ctx.parents.get(node)
        if isinstance(parent, ast.keyword):
            return parent.arg == "deepspeed"
        if isinstance(parent, ast.Assign):
            names = {d for d in (dotted(t) for t in parent.targets) if d}
            return bool(names & self._hf_deepspeed_names())
        return False

    def _hf_deepspeed_names(self) -> set[str | None]:
        """The names passed as ``deepspeed=`` (once per file, not per dict literal)."""
        return self.ctx._cached(  # type: ignore[no-any-return]
            "hf_deepspeed_names", self.ctx.tree,
            lambda: {dotted(kw.value) for kw in self._config_keywords() if kw.arg == "deepspeed"})

    def _config_keywords(self) -> list[ast.keyword]:
        def compute() -> list[ast.keyword]:
            return [
                kw for call in self.ctx.of(ast.Call) for kw in call.keywords if kw.arg in _CONFIG_KEYWORDS
            ]
        return self.ctx._cached("config_kw", self.ctx.tree, compute)  # type: ignore[no-any-return]

    def _assigned_to_config_name(self, node: ast.AST) -> bool:
        parent = self.ctx.parents.get(node)
        if isinstance(parent, ast.Assign | ast.AnnAssign):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            return any(_DS_CONFIG_NAME.search(last_part(dotted(t))) for t in targets)
        return False

    def _holder_name(self, node: ast.AST) -> str | None:
        """The variable a config literal, or a config file's ``json.load(...)``, is assigned to:
        ``cfg = {...}``, ``cfg = json.load(open("ds.json"))``, or ``with open("ds.json") as f:
        cfg = json.load(f)``."""
        cur: ast.AST | None = node
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = self.ctx.parents.get(cur)
        if isinstance(cur, ast.Assign) and len(cur.targets) == 1:
            return dotted(cur.targets[0])
        if isinstance(cur, ast.AnnAssign):
            return dotted(cur.target)
        if isinstance(cur, ast.With | ast.AsyncWith):
            handles = {
                dotted(item.optional_vars) for item in cur.items
                if item.optional_vars is not None and any(sub is node for sub in ast.walk(item.context_expr))
            } - {None}
            for stmt in cur.body:
                if (
                    isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and any(dotted(sub) in handles for sub in ast.walk(stmt.value)
                            if isinstance(sub, ast.Name))
                ):
                    return dotted(stmt.targets[0])
        return None

    def _apply_later_updates(self, name: str, cfg: dsconfig.ConfigDict, node: ast.AST | None = None) -> None:
        """``cfg["gradient_clipping"] = 1.0`` / ``cfg.update(...)`` after ``cfg = {...}``: an
        update of the literal's own scope that always runs, with literal arguments, is applied
        (:meth:`NameResolver.apply_updates`); any other makes the config partial."""
        subs, updated = self._updates_by_name()
        resolve = self.resolver().resolve
        for n in subs.get(name, ()):
            for t in n.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.slice, ast.Constant)
                    and isinstance(t.slice.value, str)
                    and dotted(t.value) == name
                ):
                    cfg[t.slice.value] = literal_value(n.value, resolve)
                    cfg.key_lines.setdefault((t.slice.value,), n.lineno)
        if name not in updated:
            return
        stmt = self.ctx.parents.get(node) if node is not None else None
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and "." not in name:
            resolver = self.resolver()
            resolver.apply_updates(name, resolver.scope_of(stmt), stmt, cfg)
        else:
            cfg.partial = True

    def value_node(self, ref: DsConfigRef, key: str) -> ast.AST | None:
        """The expression that sets top-level ``key`` in the script: the last
        ``cfg["key"] = <expr>`` on the config's variable, else the literal's entry."""
        if ref.name is not None:
            subs, _ = self._updates_by_name()
            hits = [
                n for n in subs.get(ref.name, ())
                for t in n.targets
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == key
            ]
            if hits:
                resolver = self.resolver()
                last = hits[-1]
                if ref.cfg.get(key) is dsconfig.UNKNOWN and not resolver.always_runs(last):
                    return None  # written under a condition: either value may hold
                return last.value
        node = self.resolver().literal_of(ref.node)
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == key:
                    # a literal the config no longer holds was overwritten (an update that may run)
                    return None if isinstance(v, ast.Constant) and ref.cfg.get(key) is dsconfig.UNKNOWN else v
        elif isinstance(node, ast.Call) and not isinstance(node.func, ast.Attribute):
            for kw in node.keywords:
                if kw.arg == key:
                    return kw.value
        return None

    def _find_ds_config(self) -> DsConfigRef | None:
        base = self.ctx.path.parent if self.ctx.path is not None else None
        tried = 0
        for node in self.ctx.of(ast.Constant):
            if (
                base is None
                or not isinstance(node.value, str)
                or len(node.value) >= 300
                or not re.search(r"\.(h?json|jsonc?)$", node.value)
            ):
                continue
            tried += 1
            if tried > _MAX_JSON_CANDIDATES:
                break
            cands = [base / node.value, Path(node.value)]
            if isinstance(self.ctx.parents.get(node), ast.JoinedStr) and node.value.startswith("/"):
                cands.insert(0, base / node.value.lstrip("/"))  # f"{HERE}/ds_config.json"
            for cand in cands:
                try:
                    if not cand.is_file():
                        continue
                    cfg = dsconfig.load_config(cand)
                except (OSError, ValueError):
                    continue
                if not any(k in cfg for k in (*_DS_BATCH_KEYS, "zero_optimization")):
                    continue
                line = cfg.key_lines.get(("gradient_accumulation_steps",))
                where = node.value + (f":{line}" if line else "")
                name = self._holder_name(node)
                if name is not None:
                    raw = dict(cfg)
                    self._apply_later_updates(name, cfg)
                    if dict(cfg) != raw:
                        where += " as updated in the script"
                return DsConfigRef(cfg, where, node, literal=False, name=name)
        literals = self.ds_config_literals()
        if literals:
            return literals[0]
        return self._launcher_config()

    def _launcher_config(self) -> DsConfigRef | None:
        """The config a launcher beside the script gives it on the command line
        (``deepspeed train.py --deepspeed --deepspeed_config ds.json`` in ``run.sh``), for a
        DeepSpeed script that reads ``--deepspeed_config`` (``deepspeed.add_config_arguments``
        or its own argument) and names no config itself: read when the launchers agree on one
        file that exists beside the script."""
        path = self.ctx.path
        if path is None or not self.ctx.deepspeed:
            return None
        anchor = next((c for c in self.ctx.of(ast.Call) if call_attr(c) == "add_config_arguments"), None)
        if anchor is None:
            anchor = next((c for c in self.ctx.of(ast.Constant)
                           if isinstance(c.value, str) and c.value in ("--deepspeed_config", "--deepspeed-config")), None)
        if anchor is None:
            return None
        found = launcher_configs(path)
        if len(found) != 1:
            return None  # none, or several different ones: which one runs cannot be told
        (cfg_path, where), = found.items()
        try:
            cfg = dsconfig.load_config(cfg_path)
        except (OSError, ValueError):
            return None
        if not any(k in cfg for k in (*_DS_BATCH_KEYS, "zero_optimization")):
            return None
        return DsConfigRef(cfg, f"{cfg_path.name}, given by {where}", anchor, literal=False)
