"""Value questions of a lint file context: the integer a name holds, and whether an
expression is built from the world size or the number of accumulation steps."""

from __future__ import annotations

import ast
import re

from accumguard.static.lint._ast import (
    ACCUM_RE,
    WORLD_RE,
    call_attr,
    dotted,
    last_part,
    position,
    walk_all,
)
from accumguard.static.lint._ctx_file import FileIndex


class ValueFacts(FileIndex):
    """Names derived from W or K, and integer values by name, on top of the file index."""

    # ---------------------------------------------------------------- values by name

    def _derived_names(self, pattern: re.Pattern[str], seed: frozenset[str] = frozenset()) -> set[str]:
        """Names assigned (to a fixpoint) from an expression mentioning ``pattern`` or a name
        of ``seed`` (kept in the result): ``size = float(dist.get_world_size())``, ``K =
        args.grad_accum_steps``, ``W = args.nproc`` when ``args.nproc`` is given as the
        world size."""
        def compute() -> set[str]:
            out: set[str] = set(seed)
            for _ in range(3):
                before = len(out)
                for names, value in self._pairs():
                    v = _unwrap_alias(value)
                    if (
                        v is not None
                        and names[0] not in out
                        and self._mentions(_alias_core(v), pattern, out, index=False)
                    ):
                        out.update(names)
                if len(out) == before:
                    break
            return out
        key = "derived:" + pattern.pattern + ("+" + ",".join(sorted(seed)) if seed else "")
        return self._cached(key, self.tree, compute)  # type: ignore[no-any-return]

    def _pairs(self) -> list[tuple[list[str], ast.AST]]:
        """Single-name assignments, with ``K, W = a, b`` taken apart into ``K = a``, ``W = b``."""
        out: list[tuple[list[str], ast.AST]] = []
        for names, value in self._assigns:
            if len(names) == 1:
                out.append((names, value))
            elif isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(names):
                out.extend(([n], v) for n, v in zip(names, value.elts, strict=True))
        return out

    @staticmethod
    def _mentions(expr: ast.AST, pattern: re.Pattern[str], names: set[str], *, index: bool = True) -> bool:
        """``expr`` names the pattern or one of ``names``; without ``index``, not in the
        bounds of a slice (``mbs[w * K:(w + 1) * K]`` is data K selected, not a number made
        from K; ``c["grad_accum"]`` still reads K)."""
        skip = set() if index else {id(x) for s in walk_all(expr) if isinstance(s, ast.Slice)
                                    or (isinstance(s, ast.Subscript) and s in _positional(expr))
                                    for x in walk_all(s.slice if isinstance(s, ast.Subscript) else s)}
        if not index:
            skip |= {id(x) for a in _data_op_args(expr) for x in walk_all(a)}
        for sub in walk_all(expr):
            if id(sub) in skip:
                continue
            if isinstance(sub, ast.Name | ast.Attribute):
                d = dotted(sub)
                if d is not None and d in names:
                    return True
                ident = sub.id if isinstance(sub, ast.Name) else sub.attr
                if pattern.search(ident.lower()):
                    return True
            elif (
                isinstance(sub, ast.Constant)
                and isinstance(sub.value, str)
                and len(sub.value) < 40
                and pattern.search(sub.value.lower())
            ):
                return True
        return False

    def reaching_write(self, fn: ast.AST, name: str, use: ast.AST) -> ast.Assign | ast.AugAssign | None:
        """The last statement of ``fn`` before ``use`` that writes ``name`` (plainly, in a
        tuple, or augmented) in a block around ``use``: the write that reaches it, since one
        in another branch or loop body does not (a reference loop after the training loop
        reuses the training's names). None when there is none."""
        around: set[ast.AST] = set()
        cur = self.parents.get(use)
        while cur is not None and cur is not fn:
            around.add(cur)
            cur = self.parents.get(cur)
        around.add(fn)
        writes = [n for n in self.local_nodes(fn) if isinstance(n, ast.Assign | ast.AugAssign)
                  and n not in around and position(n) < position(use) and self.parents.get(n) in around
                  and any(isinstance(t, ast.Name) and t.id == name
                          for t in walk_all(n.targets[0] if isinstance(n, ast.Assign) else n.target))]
        return max(writes, key=position) if writes else None

    def int_value(self, expr: ast.AST | None, *, defaults: bool = True) -> int | None:
        """The integer ``expr`` holds, when the file says so in one way: a literal, a name whose
        every assignment is the same integer literal, or ``args.x`` / ``cfg.x`` whose argparse
        ``default=`` or class-field default is an integer (what the script runs with by default)."""
        if isinstance(expr, ast.Constant):
            return expr.value if type(expr.value) is int else None
        if isinstance(expr, ast.Subscript):
            return self._dict_entry(expr)
        d = dotted(expr)
        if d is None:
            return None
        values = set(self._int_assignments().get(d, ()))
        if not values and "." in d and defaults:
            values = self._int_defaults().get(last_part(d), set())
        return next(iter(values)) if len(values) == 1 and None not in values else None

    def int_through_names(self, expr: ast.AST) -> int | None:
        """:meth:`int_value`, or for a name assigned other expressions the one integer they
        all hold (``K = cfg["accum_steps"]`` in each function that names it K,
        ``self.accum = args.grad_accum``)."""
        v = self.int_value(expr)
        d = dotted(expr)
        if v is None and d is not None:
            found = {self.int_value(x) for x in self.values_by_name().get(d, [])}
            v = next(iter(found)) if len(found) == 1 else None
        return v

    def switch_default(self, flag: ast.AST) -> bool | None:
        """The boolean a switch ``flag`` (``r.clip_grad``, ``args.clip``) holds by default: its
        dataclass field's literal, or an argparse ``store_true`` (False) / ``store_false``
        (True) option; None when not in sight or defined several ways."""
        name = flag.attr if isinstance(flag, ast.Attribute) else flag.id if isinstance(flag, ast.Name) else None
        if name is None:
            return None
        found: list[bool] = []
        for n in self.of(ast.AnnAssign, ast.Assign):
            targets = [n.target] if isinstance(n, ast.AnnAssign) else n.targets
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) \
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, bool):
                found.append(n.value.value)
        for c in self.of(ast.Call):
            if (dotted(c.func) or "").endswith("add_argument") and any(
                    isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.lstrip("-").replace("-", "_") == name for a in c.args):
                action = next((k.value.value for k in c.keywords if k.arg == "action"
                               and isinstance(k.value, ast.Constant)), None)
                given = next((k.value.value for k in c.keywords if k.arg == "default"
                              and isinstance(k.value, ast.Constant)
                              and isinstance(k.value.value, bool)), None)
                if given is not None:
                    found.append(given)  # `store_true` with `default=True`: on
                elif action in ("store_true", "store_false"):
                    found.append(action == "store_false")
        return found[0] if len(set(found)) == 1 else None

    def int_candidates(self, expr: ast.AST | None) -> set[int | None]:
        """Every integer the file gives ``expr`` (None for a computed value): its literal, each
        assignment to the name, and for ``args.x`` / ``cfg.x`` the argparse or field default."""
        if isinstance(expr, ast.Constant):
            return {expr.value if type(expr.value) is int else None}
        if isinstance(expr, ast.Subscript):
            return {self._dict_entry(expr)}
        d = dotted(expr)
        if d is None:
            return {None}
        values = set(self._int_assignments().get(d, ()))
        if "." in d:
            values |= self._int_defaults().get(last_part(d), set())
        elif values == {None}:
            # `K = args.accum` assigned once: the attribute's default (argparse, a field)
            sources = self._sole_attribute_sources().get(d)
            if sources is not None:
                values = set(self._int_defaults().get(last_part(sources), set())) or values
        return values or {None}

    def _sole_attribute_sources(self) -> dict[str, str]:
        """Plain names assigned exactly once in the file, to an attribute (``K = args.accum``):
        name -> the attribute's dotted name."""
        def compute() -> dict[str, str]:
            seen: dict[str, list[ast.AST]] = {}
            for names, value in self._assigns:
                for name in names:
                    seen.setdefault(name, []).append(value if len(names) == 1 else ast.Pass())
            return {name: d for name, vals in seen.items() if "." not in name and len(vals) == 1
                    and isinstance(vals[0], ast.Attribute) and (d := dotted(vals[0])) is not None}
        return self._cached("sole_attribute_sources", self.tree, compute)  # type: ignore[no-any-return]

    def _dict_entry(self, expr: ast.Subscript) -> int | None:
        """The integer literal :meth:`dict_entry` finds."""
        hit = self.dict_entry(expr)
        if not isinstance(hit, ast.Constant) or type(hit.value) is not int:
            return None
        return hit.value

    def dict_entry(self, expr: ast.Subscript) -> ast.AST | None:
        """The value written for ``CONFIG["grad_accum"]`` when ``CONFIG`` is assigned once in the
        file, a dict literal with one entry for that string key, and nothing else writes that
        entry (no ``CONFIG["grad_accum"] = ``, no store under a computed key, no
        ``.update()``, ``.setdefault()``, ``**`` spread, ``del``); a store under another
        constant key (``CONFIG["seed"] = args.seed``) leaves it as written."""
        d = dotted(expr.value)
        key = expr.slice
        if d is None or not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            return None
        def compute() -> dict[str, tuple[ast.Dict, set[object]] | None]:
            literals: dict[str, tuple[ast.Dict, set[object]] | None] = {}
            aliases: dict[str, str] = {}  # `cfg = CFG`: the same dict under another name
            for names, value in self._assigns:
                if isinstance(value, ast.Call) and dotted(value.func) == "dict" \
                        and not value.args and all(k.arg for k in value.keywords):
                    value = ast.Dict(keys=[ast.Constant(k.arg) for k in value.keywords],
                                     values=[k.value for k in value.keywords])  # dict(k=v)
                for name in names:
                    once = len(names) == 1 and name not in literals
                    if once and isinstance(value, ast.Name):
                        aliases[name] = value.id
                    literals[name] = (value, set()) if once and isinstance(value, ast.Dict) \
                        else None
            linked: dict[str, str] = {}
            for _ in range(2):  # (a chain: `self.cfg = cfg`, `cfg = CFG`)
                for alias, source in aliases.items():
                    entry = literals.get(source)
                    if entry is not None and alias not in linked:
                        literals[alias] = entry  # (written once, from the literal's name)
                        linked[alias] = source
            for n in self.of(ast.Call):
                if isinstance(n.func, ast.Attribute) and n.func.attr in ("update", "setdefault", "pop", "clear") \
                        and (r := dotted(n.func.value)) in literals:
                    literals[r] = None
            for node in self.of(ast.Subscript):
                if isinstance(node.ctx, ast.Load) or (r := dotted(node.value)) not in literals:
                    continue
                entry = literals[r]
                if entry is not None and isinstance(node.slice, ast.Constant) \
                        and isinstance(node.slice.value, str):
                    entry[1].add(node.slice.value)  # one other entry written
                else:
                    literals[r] = None
            for _ in range(2):  # a write through either name spoils both
                for alias, source in linked.items():
                    if literals.get(alias) is None or literals.get(source) is None:
                        literals[alias] = literals[source] = None
            return literals
        found = self._cached("dict_literals", self.tree, compute).get(d)
        if found is None or key.value in found[1]:
            return None
        literal = found[0]
        if any(k is None for k in literal.keys):
            return None
        hits = [v for k, v in zip(literal.keys, literal.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == key.value]
        return hits[0] if len(hits) == 1 else None

    def _int_assignments(self) -> dict[str, set[int | None]]:
        """Every value assigned to each name: the integer literal, or None for anything else."""
        def compute() -> dict[str, set[int | None]]:
            out: dict[str, set[int | None]] = {}
            for names, value in self._assigns:
                if len(names) == 1:
                    v = value.value if isinstance(value, ast.Constant) and type(value.value) is int else None
                    out.setdefault(names[0], set()).add(v)
                else:
                    for name in names:
                        out.setdefault(name, set()).add(None)
            for n in self.of(ast.AugAssign):
                if (d := dotted(n.target)) is not None:
                    out.setdefault(d, set()).add(None)
            for cls in self.of(ast.ClassDef):
                # a module-level config class's attribute (`class Cfg: rows = 104`), read as
                # `Cfg.rows` (a `Cfg.rows = ...` elsewhere adds its own value)
                if not isinstance(self.parents.get(cls), ast.Module):
                    continue
                for stmt in cls.body:
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                            and isinstance(stmt.targets[0], ast.Name):
                        val = stmt.value
                        out.setdefault(f"{cls.name}.{stmt.targets[0].id}", set()).add(
                            val.value if isinstance(val, ast.Constant) and type(val.value) is int
                            else None)
            return out
        return self._cached("int_assigns", self.tree, compute)  # type: ignore[no-any-return]

    def _int_defaults(self) -> dict[str, set[int | None]]:
        """argparse ``add_argument("--grad-accum", default=4)`` and class fields
        ``gradient_accumulation_steps: int = 4`` (or plain class attributes, ``accum = 4``,
        ``bs, accum = 8, 4``), by lower-cased attribute name."""
        def compute() -> dict[str, set[int | None]]:
            out: dict[str, set[int | None]] = {}
            for call in self.of(ast.Call):
                if call_attr(call) != "add_argument":
                    continue
                default = next((k.value for k in call.keywords if k.arg == "default"), None)
                dest = next((k.value.value for k in call.keywords
                             if k.arg == "dest" and isinstance(k.value, ast.Constant)), None)
                if dest is None:
                    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                    long = [f for f in flags if f.startswith("--")] or flags
                    dest = long[0].lstrip("-").replace("-", "_") if long else None
                if isinstance(dest, str) and default is not None:
                    v = default.value if isinstance(default, ast.Constant) and type(default.value) is int else None
                    out.setdefault(dest.lower(), set()).add(v)

            def whole(node: ast.AST) -> int | None:
                return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None

            for cls in self.of(ast.ClassDef):
                for stmt in cls.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                        out.setdefault(stmt.target.id.lower(), set()).add(whole(stmt.value))
                    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        # plain class attributes: `grad_accum = 4`, `bs, grad_accum = 8, 4`
                        tgt, val = stmt.targets[0], stmt.value
                        pairs = (list(zip(tgt.elts, val.elts, strict=True))
                                 if isinstance(tgt, ast.Tuple) and isinstance(val, ast.Tuple)
                                 and len(tgt.elts) == len(val.elts) else [(tgt, val)])
                        for name, value in pairs:
                            if isinstance(name, ast.Name):
                                out.setdefault(name.id.lower(), set()).add(whole(value))
            return out
        return self._cached("int_defaults", self.tree, compute)  # type: ignore[no-any-return]

    def mentions_world(self, expr: ast.AST) -> bool:
        """``expr`` is (or is built from) the world size."""
        names = self._cached("world_names", self.tree, lambda: self._derived_names(
            WORLD_RE, frozenset(self._world_keywords())))
        if self._mentions(expr, WORLD_RE, names):
            return True
        # `world_size=cfg.W` given, `c.W` read (the same config field through another name)
        fields = self._cached("world_fields", self.tree, lambda: {
            d.rsplit(".", 1)[1] for d in self._world_keywords() if "." in d})
        return bool(fields) and any(isinstance(sub, ast.Attribute) and sub.attr in fields
                                    for sub in walk_all(expr))

    def _world_keywords(self) -> set[str]:
        """Names given as the number of processes: ``init_process_group(world_size=W)``,
        ``mp.spawn(fn, nprocs=W)``, ``Trainer(devices=NGPU)``: whatever the script calls it,
        the world size."""
        def compute() -> set[str]:
            return {d for call in self.of(ast.Call) for k in call.keywords
                    if k.arg in ("world_size", "nprocs", "num_processes")
                    and isinstance(k.value, ast.Name | ast.Attribute)
                    and (d := dotted(k.value)) is not None}
        return self._cached("world_keywords", self.tree, compute)  # type: ignore[no-any-return]

    def mentions_accum(self, expr: ast.AST) -> bool:
        """``expr`` is (or is built from) the number of accumulation steps: a name that says
        so (``grad_accum_steps``), one assigned from it, or the modulus of the test that
        gates an optimizer step (``K`` in ``if (i + 1) % K == 0: opt.step()``)."""
        names = self._cached("accum_names", self.tree, lambda: self._derived_names(ACCUM_RE)
                             | self._boundary_moduli() | self._k_keywords())
        return self._mentions(expr, ACCUM_RE, names)

    def _k_keywords(self) -> set[str]:
        """Names given as the accumulation count: ``TrainingArguments(
        gradient_accumulation_steps=GA_STEPS)``, ``Trainer(accumulate_grad_batches=K)``,
        ``{"gradient_accumulation_steps": GA}``, ``GradientAccumulationPlugin(num_steps=K)``:
        whatever the script calls it, K."""
        def compute() -> set[str]:
            out: set[str] = set()
            for node in self.of(ast.Call, ast.Dict):
                pairs: list[tuple[str, ast.AST | None]] = (
                    [(k.arg or "", k.value) for k in node.keywords] if isinstance(node, ast.Call)
                    else [(k.value if isinstance(k, ast.Constant) and isinstance(k.value, str)
                           else "", v) for k, v in zip(node.keys, node.values, strict=True)])
                plugin = isinstance(node, ast.Call) and (dotted(node.func) or "").endswith(
                    "GradientAccumulationPlugin")  # (its `num_steps=` is K)
                for key, value in pairs:
                    if key and value is not None and isinstance(value, ast.Name | ast.Attribute) \
                            and (ACCUM_RE.search(key.lower()) or (plugin and key == "num_steps")):
                        d = dotted(value)
                        if d:
                            out.add(d)
            return out
        return self._cached("k_keywords", self.tree, compute)  # type: ignore[no-any-return]

    def sized_by_accum(self, expr: ast.AST, depth: int = 2) -> bool:
        """``expr`` is computed from K, also through names assigned from arithmetic on it
        (``win = bs * grad_accum * world`` then ``range(s * win, (s + 1) * win)``): a data
        size of a whole window, which :meth:`mentions_accum` (names that *are* K) does not
        count. Only arithmetic is followed: a count made over a list of K batches is a count,
        not a size in K."""
        if self.mentions_accum(expr):
            return True
        if depth == 0:
            return False
        names = {d for x in walk_all(expr) if isinstance(x, ast.Name | ast.Attribute)
                 and (d := dotted(x)) is not None}
        by_name = self.sole_values_by_name()
        return any(isinstance(v, ast.BinOp) and self.sized_by_accum(v, depth - 1)
                   for n in names for v in by_name.get(n, ()))

    def _boundary_moduli(self) -> set[str]:
        """Names ``K`` of ``if ... % K ...:`` tests whose body calls ``.step()``: whatever
        the script calls it, the window's size."""
        def steps(body: list[ast.stmt], depth: int = 1) -> bool:
            # (`self.optimizer_step()`: a file function that steps, one call deep)
            for stmt in body:
                for c in walk_all(stmt):
                    if not isinstance(c, ast.Call):
                        continue
                    if call_attr(c) == "step":
                        return True
                    name = call_attr(c)
                    defs = self.defs_by_name().get(name, []) if depth and name else []
                    if len(defs) == 1 and steps(defs[0].body, depth - 1):
                        return True
            return False

        def compute() -> set[str]:
            out: set[str] = set()
            flags: dict[str, str] = {}  # `sync = (i + 1) % K == 0` -> {"sync": "K"}
            tested: set[str] = set()  # flags an `if` that steps tests
            for mod in self.of(ast.BinOp):
                d = dotted(mod.right) if isinstance(mod.op, ast.Mod) else None
                if d is None:
                    continue
                child, cur = mod, self.parents.get(mod)
                while cur is not None and not isinstance(cur, ast.stmt):
                    child, cur = cur, self.parents.get(cur)
                if isinstance(cur, ast.If) and child is cur.test and steps(cur.body):
                    out.add(d)
                elif isinstance(cur, ast.Assign) and len(cur.targets) == 1 \
                        and isinstance(cur.targets[0], ast.Name):
                    flags[cur.targets[0].id] = d
            if flags:  # one walk: the names tested by an `if` that steps
                for use in walk_all(self.tree):
                    if isinstance(use, ast.If) and steps(use.body):
                        tested.update(n.id for n in walk_all(use.test) if isinstance(n, ast.Name))
            return out | {d for n, d in flags.items() if n in tested}
        return self._cached("boundary_moduli", self.tree, compute)  # type: ignore[no-any-return]


def _alias_core(value: ast.AST) -> ast.AST:
    """What of an alias names the quantity: for a call, its callee and its string arguments
    (``dist.get_world_size(group)``, ``os.getenv("WORLD_SIZE")``), not the values passed to
    it: ``data = rank_batches(rank, world)`` is data, not the world size, and neither is a
    count computed from it."""
    if not isinstance(value, ast.Call):
        return value
    strings: list[ast.expr] = [a for a in value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return ast.Tuple(elts=[value.func, *strings], ctx=ast.Load())


def _unwrap_alias(value: ast.AST) -> ast.AST | None:
    """The aliased expression of ``float(dist.get_world_size())``, ``args.grad_accum``,
    ``len(micro_batches)`` or ``int(os.environ["WORLD_SIZE"])``; None for arithmetic or
    anything else (a name derived from W by a computation is not W)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in (
        "int", "float", "len"
    ) and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, ast.Name | ast.Attribute | ast.Subscript | ast.Call | ast.Constant):
        return value
    return None


def _positional(expr: ast.AST) -> list[ast.Subscript]:
    """The subscripts of ``expr`` indexed by a computed position (``counts[micro // K]``):
    data selected by K, not K (a key such as ``cfg["grad_accum"]`` still reads K)."""
    return [s for s in walk_all(expr) if isinstance(s, ast.Subscript)
            and isinstance(s.slice, ast.BinOp | ast.Call)]


#: tensor methods whose arguments shape or reduce data (``counts.reshape(-1, K).sum(1)``: a
#: count per window, not K); ``chunk``/``split`` are not here (their pieces number K)
_DATA_OPS = frozenset({"reshape", "view", "sum", "mean", "gather", "all_gather", "expand",
                       "repeat", "narrow", "unflatten", "index_select"})


def _data_op_args(expr: ast.AST) -> list[ast.AST]:
    """The arguments of the data methods in ``expr``."""
    return [a for c in walk_all(expr) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr in _DATA_OPS for a in (*c.args, *(k.value for k in c.keywords))]
