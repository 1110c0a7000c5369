"""A DeepSpeed config written in the script, read as far as its values are evident.

:func:`config_from_literal` turns a dict literal (or ``dict(...)`` call) into a
:class:`~accumguard.static.dsconfig.ConfigDict` with each key's line; computed values become
``UNKNOWN``. What it cannot see makes the config ``partial`` — unless a *resolver* can read
it: :class:`NameResolver` follows, within the file,

* a ``**base`` spread or a ``dict(base, ...)`` / ``{**base, ...}`` merge, and a section
  given by name (``zero_optimization=zero``), to the one dict literal that name is bound to
  in its function (or the module), with the ``name["key"] = v`` and ``name.update(...)``
  statements that follow it there (``copy.deepcopy(base)``, ``base.copy()`` and
  ``dict(base)`` read as ``base``);
* a ``@dataclass`` instance (``DSConfig(...)``, or a name bound once to one): its fields'
  defaults with the call's keywords over them, a field whose default is another dataclass
  (``field(default_factory=ZeroCfg)``, ``= ZeroCfg()``) read as a nested section;
* ``self.field`` in a config a dataclass's own method writes (``"gradient_accumulation_steps":
  self.grad_accum``), when the file builds that dataclass once, by keywords, and never
  assigns the field afterwards: the value of that one construction.

An ``update`` inside an ``if``/loop/``try``, or one whose argument is not a literal, may or may
not run: the config becomes ``partial`` (checks on an *absent* key are skipped).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterable
from typing import Any

from accumguard.static import dsconfig
from accumguard.static.lint._ast import FUNCS, dotted, last_part, walk_local

#: what a resolver gives for an expression: the config section it evaluates to, or None
Resolve = Callable[[ast.AST], dsconfig.ConfigDict | None]

_MAX_DEPTH = 4  # names followed to names, dataclasses nested in dataclasses
_STRAIGHT = (ast.With, ast.AsyncWith, ast.Module, *FUNCS)


def is_dict_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict")


def literal_keys(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    if isinstance(node, ast.Call):
        return [k.arg for k in node.keywords if k.arg]
    return []


def literal_value(node: ast.AST, resolve: Resolve | None = None) -> Any:
    """The value of a literal; nested dicts keep UNKNOWN for what is computed."""
    if is_dict_literal(node):
        sub = config_from_literal(node, resolve=resolve)
        return dsconfig.UNKNOWN if sub is None else dict(sub)
    if resolve is not None and isinstance(node, ast.Name | ast.Call) and (sub := resolve(node)) is not None:
        return dict(sub)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return dsconfig.UNKNOWN


def config_from_literal(node: ast.AST, prefix: tuple[str, ...] = (),
                        resolve: Resolve | None = None) -> dsconfig.ConfigDict | None:
    """A :class:`ConfigDict` from a dict literal / ``dict(...)``, with each key's line;
    computed values become ``UNKNOWN`` and a ``**spread`` the resolver cannot read makes it
    partial."""
    items: list[tuple[ast.AST | None, ast.AST, int]]
    data: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    partial = False
    if isinstance(node, ast.Dict):
        items = [(k, v, (k or v).lineno) for k, v in zip(node.keys, node.values, strict=True)]
    elif isinstance(node, ast.Call):
        items = [(ast.Constant(k.arg) if k.arg else None, k.value, k.value.lineno) for k in node.keywords]
        if len(node.args) > 1:
            return None
        if node.args:  # dict(base, key=...)
            items.insert(0, (None, node.args[0], node.args[0].lineno))
    else:
        return None
    for k, v, line in items:
        if k is None:  # {**base, ...}
            if is_dict_literal(v):
                base = config_from_literal(v, (), resolve)
            else:
                base = resolve(v) if resolve is not None else None
            if base is None:
                partial = True
                continue
            data.update(base)
            lines.update({prefix + path: ln for path, ln in base.key_lines.items()})
            partial = partial or base.partial
            continue
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            partial = True
            continue
        key = k.value
        lines[prefix + (key,)] = line
        sub: dsconfig.ConfigDict | None = None
        if is_dict_literal(v):
            sub = config_from_literal(v, prefix + (key,), resolve)
            if sub is None:
                data[key] = dsconfig.UNKNOWN
                continue
        elif resolve is not None and isinstance(v, ast.Name | ast.Call) and (sub := resolve(v)) is not None:
            sub = dsconfig.ConfigDict(sub, key_lines={prefix + (key,) + p: ln for p, ln in sub.key_lines.items()},
                                      partial=sub.partial)
        if sub is not None:
            data[key] = dict(sub)
            lines.update(sub.key_lines)
            partial = partial or sub.partial
        else:
            data[key] = literal_value(v, resolve)
    return dsconfig.ConfigDict(data, key_lines=lines, partial=partial)


def dataclass_classes(classes: Iterable[ast.ClassDef]) -> dict[str, ast.ClassDef]:
    """The file's ``@dataclass`` classes (and pydantic ``BaseModel`` subclasses, read the same way)
    by name (a name defined twice is left out)."""
    out: dict[str, ast.ClassDef] = {}
    twice: set[str] = set()
    for c in classes:
        if any(last_part(dotted(d.func if isinstance(d, ast.Call) else d)) == "dataclass" for d in c.decorator_list) \
                or any(last_part(dotted(b)) == "basemodel" for b in c.bases):  # pydantic: the same fields
            if c.name in out:
                twice.add(c.name)
            out[c.name] = c
    return {k: v for k, v in out.items() if k not in twice}


def field_default(value: ast.expr, classes: dict[str, ast.ClassDef] | None = None) -> ast.expr:
    """A dataclass field's default: ``field(default=x)`` -> x, ``field(default_factory=lambda:
    x)`` -> x, ``field(default_factory=Cls)`` -> ``Cls()``, a plain default as is (anything
    else stays a computed value)."""
    if isinstance(value, ast.Call) and last_part(dotted(value.func)) == "field":  # also pydantic Field
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value
            if kw.arg == "default_factory":
                if isinstance(kw.value, ast.Lambda):
                    return kw.value.body
                if isinstance(kw.value, ast.Name) and classes and kw.value.id in classes:
                    return ast.copy_location(ast.Call(func=kw.value, args=[], keywords=[]), kw.value)
                if isinstance(kw.value, ast.Name) and kw.value.id == "dict":
                    return ast.copy_location(ast.Dict(keys=[], values=[]), kw.value)
    return value


def dataclass_dict(call: ast.AST, classes: dict[str, ast.ClassDef], depth: int = 0) -> ast.Dict | None:
    """``Cls(k=v, ...)`` of a ``@dataclass`` of the file as the dict ``asdict`` makes of it (its
    fields' defaults, the keywords over them; a nested dataclass a nested dict), each key at the
    line of the field or keyword that sets it. None for positional arguments or another call."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args):
        return None
    cls = classes.get(call.func.id)
    if cls is None or depth > _MAX_DEPTH:
        return None
    fields: dict[str, ast.expr] = {}
    keys: dict[str, ast.Constant] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            fields[stmt.target.id] = field_default(stmt.value, classes)
            keys[stmt.target.id] = ast.copy_location(ast.Constant(stmt.target.id), stmt)
    for kw in call.keywords:
        if kw.arg is None:
            return None
        fields[kw.arg] = kw.value
        keys[kw.arg] = ast.copy_location(ast.Constant(kw.arg), kw.value)
    values: list[ast.expr | None] = []
    for v in fields.values():
        nested = dataclass_dict(v, classes, depth + 1)
        values.append(nested if nested is not None else v)
    return ast.Dict(keys=[keys[k] for k in fields], values=values)  # type: ignore[arg-type]


class NameResolver:
    """Reads the sections of a config that the script gives by name, in one file (see the
    module doc); built per file by the config finder with the file's parent map and nodes."""

    def __init__(self, parents: dict[ast.AST, ast.AST], tree: ast.AST,
                 classes: dict[str, ast.ClassDef], assigns: Callable[[ast.AST], dict[str, list[ast.Assign]]],
                 updates: Callable[[ast.AST], dict[str, list[ast.Call]]],
                 subscripts: Callable[[ast.AST], dict[str, list[ast.Assign]]],
                 function: Callable[[str], ast.FunctionDef | ast.AsyncFunctionDef | None]) -> None:
        self.parents = parents
        self.tree = tree
        self.classes = classes
        self._assigns = assigns  # scope -> name -> its plain assignments there
        self._updates = updates  # scope -> name -> its `.update()`/`.setdefault()` calls there
        self._subscripts = subscripts  # scope -> name -> its `name["key"] = v` statements there
        self._function = function  # the file's one function of that name (None: none or several)
        self._active: set[int] = set()
        self._calls: dict[str, list[ast.Call]] | None = None
        self._attrs: set[str] | None = None

    def scope_of(self, node: ast.AST) -> ast.AST:
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, FUNCS):
            cur = self.parents.get(cur)
        return cur or self.tree

    def resolve(self, expr: ast.AST) -> dsconfig.ConfigDict | None:
        """The config section ``expr`` evaluates to, when the file makes it evident."""
        if id(expr) in self._active or len(self._active) > _MAX_DEPTH:
            return None
        self._active.add(id(expr))
        try:
            return self._resolve(expr)
        finally:
            self._active.discard(id(expr))

    def _resolve(self, expr: ast.AST) -> dsconfig.ConfigDict | None:
        if isinstance(expr, ast.Call):
            name = last_part(dotted(expr.func))
            if name in ("deepcopy", "copy", "dict") and len(expr.args) == 1 and not expr.keywords:
                return self.resolve(expr.args[0])
            if isinstance(expr.func, ast.Attribute) and expr.func.attr == "copy" and not expr.args:
                return self.resolve(expr.func.value)
            if name in ("asdict", "vars") and len(expr.args) == 1:
                return self.resolve(expr.args[0])
            if name in ("model_dump", "dict") and isinstance(expr.func, ast.Attribute) and not expr.args:
                return self.resolve(expr.func.value)  # pydantic's `cfg.model_dump()`
            lit = dataclass_dict(expr, self.classes)
            if lit is not None:
                return config_from_literal(lit, resolve=self.resolve)
            return self._returned(expr)
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) \
                and isinstance(expr.slice.value, str):  # `**CFG["train"]`
            outer = self.resolve(expr.value)
            inner = outer.get(expr.slice.value) if outer is not None else None
            if isinstance(inner, dict) and not isinstance(inner, dsconfig.ConfigDict):
                inner = dsconfig.ConfigDict(inner, partial=bool(outer and outer.partial))
            return inner if isinstance(inner, dsconfig.ConfigDict) else None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return self._field_of_instance(expr.value, expr.attr)
        if not isinstance(expr, ast.Name):
            return None
        bound = self.binding(expr)
        if bound is None:
            given = self.argument_for(expr)
            return self.resolve(given) if given is not None else None
        scope, assign = bound
        value = assign.value
        if is_dict_literal(value):
            cfg = config_from_literal(value, resolve=self.resolve)
        else:
            cfg = self.resolve(value) if isinstance(value, ast.Call | ast.Name) else None
        if cfg is not None:
            self.apply_updates(expr.id, scope, assign, cfg)
            self._apply_subscripts(expr.id, scope, assign, cfg)
        return cfg

    def _field_of_instance(self, obj: ast.Name, attr: str) -> dsconfig.ConfigDict | None:
        """``cfg.ds`` with ``cfg`` a name bound once to a ``@dataclass`` construction of the file
        (or a parameter its one caller gives one): that field's dict (its default, or the
        construction's keyword), when no statement of the file assigns the field."""
        bound = self.binding(obj)
        value = bound[1].value if bound is not None else self.argument_for(obj)
        if isinstance(value, ast.Name):
            inner = self.binding(value)
            value = inner[1].value if inner is not None else None
        lit = dataclass_dict(value, self.classes) if value is not None else None
        if lit is None or attr in self._assigned_attrs():
            return None
        for k, v in zip(lit.keys, lit.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == attr and v is not None and is_dict_literal(v):
                return config_from_literal(v, resolve=self.resolve)
        return None

    def argument_for(self, name: ast.Name) -> ast.AST | None:
        """A parameter of the function around ``name`` (never assigned there), read as the
        argument its one call in the file gives it: ``Trainer(model, cfg)`` for ``cfg`` of
        ``Trainer.__init__``, ``train(cfg)`` for ``cfg`` of ``train``."""
        fn = self.scope_of(name)
        if not isinstance(fn, FUNCS) or self._assigns(fn).get(name.id):
            return None
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        if name.id not in params:
            return None
        owner = self.parents.get(fn)
        callee = owner.name if fn.name == "__init__" and isinstance(owner, ast.ClassDef) else fn.name
        method = bool(params) and params[0] in ("self", "cls")
        sites = self._calls_by_name().get(callee.lower(), [])
        if len(sites) != 1:
            return None
        site = sites[0]
        kw = next((k.value for k in site.keywords if k.arg == name.id), None)
        if kw is not None:
            return kw
        i = params.index(name.id) - (1 if method else 0)
        if 0 <= i < len(site.args) and not any(isinstance(a, ast.Starred) for a in site.args[:i + 1]):
            return site.args[i]
        return None

    def literal_of(self, expr: ast.AST, depth: int = 4) -> ast.AST:
        """The dict literal a config expression stands for (``cfg["ds"]`` with ``cfg`` a
        parameter its one caller gives a literal), else the expression."""
        if depth <= 0 or isinstance(expr, ast.Dict):
            return expr
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) \
                and isinstance(expr.slice.value, str):
            outer = self.literal_of(expr.value, depth - 1)
            if isinstance(outer, ast.Dict):
                for k, v in zip(outer.keys, outer.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == expr.slice.value:
                        return self.literal_of(v, depth - 1)
            return expr
        if isinstance(expr, ast.Name):
            bound = self.binding(expr)
            given = bound[1].value if bound is not None else self.argument_for(expr)
            return expr if given is None else self.literal_of(given, depth - 1)
        return expr

    def _assigned_attrs(self) -> set[str]:
        """The attribute names the file assigns anywhere (``x.attr = ...``, ``+=``, annotated),
        collected once."""
        if self._attrs is None:
            self._attrs = {t.attr for n in ast.walk(self.tree)
                           if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
                           for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                           if isinstance(t, ast.Attribute)}
        return self._attrs

    def _calls_by_name(self) -> dict[str, list[ast.Call]]:
        """The file's calls by their last name, lower-cased (indexed once)."""
        if self._calls is None:
            self._calls = {}
            for c in ast.walk(self.tree):
                if isinstance(c, ast.Call):
                    self._calls.setdefault(last_part(dotted(c.func)), []).append(c)
        return self._calls

    def _returned(self, call: ast.Call) -> dsconfig.ConfigDict | None:
        """What a call of the file's function returns, when it has one ``return`` (its
        parameters are not bound: a value built from them is unknown); for ``obj.method()``
        with ``obj`` bound to a dataclass instance, a method returning ``asdict(self)``."""
        if isinstance(call.func, ast.Attribute):
            inst = self.binding(call.func.value) if isinstance(call.func.value, ast.Name) else None
            value = inst[1].value if inst is not None else call.func.value
            if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.classes):
                return None
            cls = self.classes[value.func.id]
            method = next((f for f in cls.body if isinstance(f, FUNCS) and f.name == call.func.attr), None)
            ret = _single_return(method) if method is not None else None
            if (isinstance(ret, ast.Call) and last_part(dotted(ret.func)) == "asdict" and len(ret.args) == 1
                    and isinstance(ret.args[0], ast.Name) and ret.args[0].id == "self"):
                lit = dataclass_dict(value, self.classes)
                return None if lit is None else config_from_literal(lit, resolve=self.resolve)
            return None
        if not isinstance(call.func, ast.Name):
            return None
        fn = self._function(call.func.id)
        ret = _single_return(fn) if fn is not None else None
        return None if ret is None else self.resolve(ret)

    def _apply_subscripts(self, name: str, scope: ast.AST, assign: ast.AST, cfg: dsconfig.ConfigDict) -> None:
        """``name["key"] = value`` after ``assign`` in ``scope``: the value when the statement
        always runs, else the key may hold either value (unknown)."""
        after = getattr(assign, "lineno", 0)
        for stmt in self._subscripts(scope).get(name, []):
            if stmt.lineno < after:
                continue
            for t in stmt.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                    key = t.slice.value
                    value = literal_value(stmt.value, self.resolve)
                    if not self._always_runs_stmt(stmt, scope) and cfg.get(key, dsconfig.UNKNOWN) != value:
                        value = dsconfig.UNKNOWN
                        cfg.partial = cfg.partial or key not in cfg
                    cfg[key] = value
                    cfg.key_lines[(key,)] = stmt.lineno

    def with_own_fields(self, node: ast.AST) -> ast.AST:
        """``node`` (a config literal) with each ``self.field`` of the dataclass whose method
        writes it replaced by that field's value (see the module doc); ``node`` itself when
        there is nothing to replace. The copy's nodes take their places in the parent map, so
        names inside it are still looked up in the method."""
        fields = self._own_fields(node)
        if not fields:
            return node
        reads = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                 and n.value.id == "self" and n.attr in fields]
        if not reads:
            return node
        dup = copy.deepcopy(node)
        for orig, new in zip(ast.walk(node), ast.walk(dup), strict=True):
            for child in ast.iter_child_nodes(new):
                self.parents[child] = new
            if orig is node:
                parent = self.parents.get(node)
                if parent is not None:
                    self.parents[new] = parent

        class _Fields(ast.NodeTransformer):
            def visit_Attribute(self, n: ast.Attribute) -> ast.AST:
                if isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr in fields:
                    return ast.copy_location(copy.deepcopy(fields[n.attr]), n)
                return self.generic_visit(n)

        return _Fields().visit(dup)  # type: ignore[no-any-return]

    def _own_fields(self, node: ast.AST) -> dict[str, ast.expr]:
        """The fields of the dataclass whose method holds ``node``, as the file's one
        construction of it sets them (keywords over defaults), less any field assigned
        anywhere in the file (``cfg.grad_accum = 8``) or given to ``replace``; empty when the
        class is built other than once by keywords."""
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, FUNCS):
            cur = self.parents.get(cur)
        owner = self.parents.get(cur) if cur is not None else None
        if not isinstance(owner, ast.ClassDef) or self.classes.get(owner.name) is not owner:
            return {}
        sites = [c for c in self._calls_by_name().get(owner.name.lower(), [])
                 if isinstance(c.func, ast.Name) and c.func.id == owner.name]
        lit = dataclass_dict(sites[0], self.classes) if len(sites) == 1 else None
        if lit is None:
            return {}
        changed = self._assigned_attrs() | {k.arg for c in self._calls_by_name().get("replace", [])
                                             for k in c.keywords if k.arg}
        return {k.value: v for k, v in zip(lit.keys, lit.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str) and v is not None
                and k.value not in changed}

    def binding(self, name: ast.Name) -> tuple[ast.AST, ast.Assign] | None:
        """The one assignment of ``name`` in its function, else in the module (None when
        assigned more than once there, or not at all)."""
        scope = self.scope_of(name)
        for s in (scope, self.tree) if scope is not self.tree else (scope,):
            hits = self._assigns(s).get(name.id, [])
            if hits:
                return (s, hits[0]) if len(hits) == 1 else None
        return None

    def apply_updates(self, name: str, scope: ast.AST, assign: ast.AST, cfg: dsconfig.ConfigDict) -> None:
        """``name.update({...})`` / ``name.update(k=v)`` / ``name.setdefault(k, v)`` after
        ``assign`` in ``scope``: applied when the call is a statement that always runs
        (not under an ``if``, loop or ``try``) with literal arguments; else ``partial``."""
        after = getattr(assign, "lineno", 0)
        for call in self._updates(scope).get(name, []):
            if call.lineno < after:
                continue
            if self._always_runs(call, scope) and self._apply(call, cfg):
                continue
            cfg.partial = True
            # an update that may or may not run: the keys it writes may hold either value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "update" and len(call.args) <= 1:
                merged = ast.Call(func=ast.Name("dict"), args=list(call.args), keywords=call.keywords)
                maybe = config_from_literal(merged, resolve=self.resolve)
                for key, value in (maybe or {}).items():
                    if cfg.get(key, dsconfig.UNKNOWN) != value:
                        cfg[key] = dsconfig.UNKNOWN

    def _always_runs(self, call: ast.Call, scope: ast.AST) -> bool:
        stmt = self.parents.get(call)
        if not isinstance(stmt, ast.Expr):
            return False
        return self._always_runs_stmt(stmt, scope)

    def always_runs(self, stmt: ast.AST) -> bool:
        """``stmt`` runs whenever its function (or the module) runs: no ``if``, loop or ``try``
        around it there."""
        return self._always_runs_stmt(stmt, self.scope_of(stmt))

    def _always_runs_stmt(self, stmt: ast.AST, scope: ast.AST) -> bool:
        cur = self.parents.get(stmt)
        while cur is not None and cur is not scope:
            if not isinstance(cur, _STRAIGHT):
                return False
            cur = self.parents.get(cur)
        return cur is scope

    def _apply(self, call: ast.Call, cfg: dsconfig.ConfigDict) -> bool:
        assert isinstance(call.func, ast.Attribute)
        if call.func.attr == "setdefault":
            if len(call.args) != 2 or not (isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                return False
            key = call.args[0].value
            if key not in cfg:
                cfg[key] = literal_value(call.args[1], self.resolve)
                cfg.key_lines.setdefault((key,), call.lineno)
            return True
        if len(call.args) > 1:
            return False
        merged = ast.copy_location(ast.Call(func=ast.Name("dict"), args=list(call.args), keywords=call.keywords), call)
        upd = config_from_literal(merged, resolve=self.resolve)
        if upd is None or upd.partial:
            return False
        cfg.update(upd)  # a shallow update: a nested section replaces the old one
        for key in upd:
            cfg.key_lines = {p: ln for p, ln in cfg.key_lines.items() if p[0] != key}
        cfg.key_lines.update(upd.key_lines)
        return True


def _single_return(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.expr | None:
    """The value of the function's only ``return`` (outside nested definitions), if any."""
    rets = [n for n in walk_local(fn) if isinstance(n, ast.Return)]
    return rets[0].value if len(rets) == 1 else None
