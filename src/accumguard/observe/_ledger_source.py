"""Where a training script divides its loss by the world size (read with :mod:`ast`, in the
parent process, from the file of a recorded loss call): the ledger's evidence that a total
loss weight of exactly 1/W is the loop's division by W and not a constant the user chose
(``0.5 * mse`` on two ranks weighs the same). Pure Python, stdlib only."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["k_multiplications", "multiplies_by_k", "world_divisions", "world_multiplications"]

#: Names that hold the number of data-parallel ranks.
_WORLD = re.compile(r"^(world(_size)?|num_processes|n_?procs|n_?gpus|num_gpus|ngpus|dp_size|"
                    r"dp_world_size|data_parallel_size|num_replicas|n_?ranks|num_ranks|"
                    r"world_sz|ws|W)$")
_WORLD_CALLS = ("get_world_size", "get_data_parallel_world_size")
_LOSSY = re.compile(r"loss|entropy|nll|mse|criterion", re.IGNORECASE)


def _names(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)  # os.environ["WORLD_SIZE"]
    return out


class _Scan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.world: set[str] = set()  # names assigned from a world-size expression
        # names assigned a product with a world-size factor (``global_batch = micro * K *
        # world``), or divided by the world size to give a per-rank count (``accum =
        # total_micro // world``): a divisor by such a name divides by W among other factors
        self.world_product: set[str] = set()
        # names assigned the reciprocal of such a value (``self.loss_scale = 1.0 / (K *
        # world)``): a loss multiplied by one is divided by W among other factors
        self.world_reciprocal: set[str] = set()
        self.lines: list[tuple[int, str]] = []  # (line, "/" or "*")
        self.products: list[int] = []  # lines where any value is multiplied by the world size

    def worldish(self, node: ast.AST) -> bool:
        """The divisor is or contains a factor of the world size (``K * world``)."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return self.worldish(node.left) or self.worldish(node.right)
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in self.world_product:
                return True
        return self.is_world(node)

    @staticmethod
    def lossy(node: ast.AST) -> bool:
        return any(_LOSSY.search(x) for x in _names(node))

    def is_world(self, node: ast.AST) -> bool:
        """The value itself is the world size: ``dist.get_world_size()``, ``world_size``,
        ``args.world_size``, ``int(os.environ["WORLD_SIZE"])``, ``accelerator.num_processes``."""
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _WORLD_CALLS:
                return True
            if name in ("int", "float") and len(node.args) == 1:
                return self.is_world(node.args[0])
            return False
        if isinstance(node, ast.Name):
            return bool(_WORLD.match(node.id)) or node.id in self.world
        if isinstance(node, ast.Attribute):
            return bool(_WORLD.match(node.attr))
        if isinstance(node, ast.Subscript):
            key = node.slice
            return isinstance(key, ast.Constant) and key.value == "WORLD_SIZE"
        return False

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            pairs = (list(zip(t.elts, node.value.elts, strict=False))
                     if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [(t, node.value)])
            for tgt, val in pairs:
                if (isinstance(val, ast.BinOp) and isinstance(val.op, ast.Div | ast.FloorDiv)
                        and isinstance(val.left, ast.Name | ast.Attribute) and self.is_world(val.right)):
                    # ``accum = micro_batches_per_step // world``: the dividend holds W as a
                    # factor (the micro-batches of all ranks), whatever it was built from
                    left = val.left
                    self.world_product.add(left.id if isinstance(left, ast.Name) else left.attr)
                if isinstance(tgt, ast.Name) and self.is_world(val):
                    self.world.add(tgt.id)
                elif (isinstance(tgt, (ast.Name, ast.Attribute)) and isinstance(val, ast.BinOp)
                      and isinstance(val.op, ast.Mult) and self.worldish(val)):
                    self.world_product.add(tgt.id if isinstance(tgt, ast.Name) else tgt.attr)
                elif (isinstance(tgt, (ast.Name, ast.Attribute)) and isinstance(val, ast.BinOp)
                      and isinstance(val.op, ast.Div) and isinstance(val.left, ast.Constant)
                      and self.worldish(val.right)):
                    self.world_reciprocal.add(tgt.id if isinstance(tgt, ast.Name) else tgt.attr)
        lossy_target = any(self.lossy(t) for t in node.targets)
        self._expr(node.value, lossy_target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        kind = self._scales(node.op, node.value)
        if self.lossy(node.target) and kind:
            self.lines.append((node.lineno, kind))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._expr(node, False)
        if isinstance(node.op, ast.Mult) and (self.is_world(node.left)
                                              or self.is_world(node.right)):
            self.products.append(node.lineno)
        self.generic_visit(node)

    def _scales(self, op: ast.operator, other: ast.AST) -> str:
        """``"/"`` for ``/ W``, ``"*1/"`` for ``* (1 / W)``, ``"*"`` for ``* W``, else
        ``""``."""
        if isinstance(op, ast.Div):
            return "/" if self.worldish(other) else ""
        if isinstance(op, ast.Mult):
            if isinstance(other, ast.BinOp) and isinstance(other.op, ast.Div):
                return "*1/" if self.worldish(other.right) else ""
            if isinstance(other, (ast.Name, ast.Attribute)) and (
                    other.id if isinstance(other, ast.Name) else other.attr) \
                    in self.world_reciprocal:
                return "*1/"
            return "*" if self.worldish(other) else ""
        return ""

    def _expr(self, node: ast.AST, lossy_target: bool) -> None:
        if isinstance(node, ast.BinOp) and (lossy_target or self.lossy(node.left)):
            kind = self._scales(node.op, node.right)
            if kind:
                self.lines.append((node.lineno, kind))


@functools.lru_cache(maxsize=32)
def _parsed(path: str) -> ast.Module | None:
    """The file's syntax tree, read once per path; None when it cannot be read or parsed."""
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


@functools.lru_cache(maxsize=32)
def _scanned(path: str) -> _Scan | None:
    """The file scanned twice (a name bound to the world size after its first use still
    counts), with the second pass's lines; None when it cannot be read or parsed."""
    tree = _parsed(path)
    if tree is None:
        return None
    scan = _Scan()
    scan.visit(tree)
    scan.lines, scan.products = [], []
    scan.visit(tree)
    return scan


def world_divisions(path: str) -> tuple[tuple[int, str], ...]:
    """``(line, "/")`` where ``path`` divides a loss by the world size (``loss /
    world_size``, ``loss / K / dist.get_world_size()``, ``loss /= accelerator.num_processes``),
    ``(line, "*1/")`` for ``loss * (1 / W)``, ``(line, "*")`` where it multiplies one by it;
    empty when the file cannot be read or parsed."""
    scan = _scanned(path)
    return () if scan is None else tuple(sorted(set(scan.lines)))


def reads_without_world_division(path: str) -> bool:
    """``path`` was read and parsed, and divides no loss by the world size (see
    :func:`world_divisions`): a loss's scale there owes nothing to W."""
    scan = _scanned(path)
    return scan is not None and not any(kind in ("/", "*1/") for _, kind in scan.lines)


def world_multiplications(path: str) -> tuple[int, ...]:
    """The lines where ``path`` multiplies any value by the world size (``0.5 * aux *
    world_size``, ``coef * dist.get_world_size()``); empty when the file cannot be read or
    parsed."""
    scan = _scanned(path)
    return () if scan is None else tuple(sorted(set(scan.products)))


#: Names that hold the accumulation count K.
_K = re.compile(r"^(k|accum\w*|grad_?accum\w*|gradient_accum\w*|accumulat\w*|ga|ga_steps|"
                r"n_?micro\w*|num_micro\w*|micro_steps|micro_per_step|update_freq|"
                r"n_?accum\w*|num_accum\w*|window(_size)?)$", re.IGNORECASE)


@functools.lru_cache(maxsize=32)
def k_multiplications(path: str) -> tuple[int, ...] | None:
    """The lines where ``path`` multiplies a loss by a name that holds the accumulation count
    (``loss * grad_accum``, ``return loss * args.accum_steps``, ``(loss * K).backward()``,
    ``loss *= K``, or through a name assigned from one), in a statement that builds a loss:
    one assigning a loss-named target, a ``return``, or a ``backward`` call; not an index
    (``batches[i * K]``) or a size. None when the file cannot be read or parsed. The ledger's
    evidence that a total loss weight of exactly K is a multiplication by K, not a constant
    that equals it (a distillation loss's T ** 2 = 4 beside K = 4)."""
    tree = _parsed(path)
    if tree is None:
        return None

    def named_k(node: ast.AST, held: set[str]) -> bool:
        return isinstance(node, ast.Name | ast.Attribute) and any(
            _K.match(x) or x in held for x in _names(node))

    held: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and named_k(node.value, set()):
            held |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def products(node: ast.AST) -> Iterator[int]:
        if isinstance(node, ast.Subscript | ast.Lambda) or (
                isinstance(node, ast.Call) and not (
                    isinstance(node.func, ast.Attribute) and node.func.attr == "backward")
                and not (isinstance(node.func, ast.Name) and node.func.id in ("float", "int"))):
            if not isinstance(node, ast.Call):
                return
            yield from products(node.func)  # ((loss * K).backward(): the receiver)
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
                and (named_k(node.left, held) or named_k(node.right, held)):
            yield node.lineno
        for child in ast.iter_child_nodes(node):
            yield from products(child)

    lines: set[int] = {  # a loss-named value times K, wherever it is written
        n.lineno for n in ast.walk(tree) if isinstance(n, ast.BinOp)
        and isinstance(n.op, ast.Mult) and any(
            named_k(a, held) and _Scan.lossy(b)
            for a, b in ((n.left, n.right), (n.right, n.left)))}
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Assign) and any(_Scan.lossy(t) for t in stmt.targets) \
                or isinstance(stmt, ast.Return) and stmt.value is not None:
            lines.update(products(stmt.value))  # type: ignore[arg-type]
        elif isinstance(stmt, ast.AugAssign) and _Scan.lossy(stmt.target):
            if isinstance(stmt.op, ast.Mult) and named_k(stmt.value, held):
                lines.add(stmt.lineno)
            lines.update(products(stmt.value))
        elif isinstance(stmt, ast.Expr) and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                and c.func.attr == "backward" for c in ast.walk(stmt.value)):
            lines.update(products(stmt.value))
    return tuple(sorted(lines))


def multiplies_by_k(site: str) -> bool:
    """The file of the loss call at ``site`` (``path:line``) multiplies a loss by a name
    holding K (or cannot be read: the run's constants then stand alone): a factor equal to K
    is then taken for K."""
    lines = k_multiplications(site.rpartition(":")[0]) if ":" in site else None
    return lines is None or bool(lines)


#: values a loss's scalar factor is built of: names, attributes, constants, arithmetic
_SCALAR = (ast.Name, ast.Attribute, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Subscript)


@functools.lru_cache(maxsize=32)
def loss_scalar_lines(path: str, backward_line: int) -> frozenset[int]:
    """The lines that build the loss backpropagated at ``backward_line`` by arithmetic: that
    line, and in its function every assignment of a name it reads, followed through
    arithmetic (``loss = ce + coef * aux``, ``coef = 0.01 * world``) but not into a call's
    arguments (a data size built from the world size, ``n = bs * K * num_processes``, feeds a
    loader, not the loss's scale). Empty when the file cannot be read or parsed."""
    tree = _parsed(path)
    if tree is None:
        return frozenset()
    scope: ast.AST = tree
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) \
                and fn.lineno <= backward_line <= (fn.end_lineno or fn.lineno):
            scope = fn  # the innermost one wins (walk goes outside in)
    assigns: dict[str, list[ast.Assign]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        assigns.setdefault(n.id, []).append(node)
    lines = {backward_line}
    todo = [n.id for stmt in ast.walk(scope) if getattr(stmt, "lineno", None) == backward_line
            for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for a in assigns.get(name, []):
            lines.add(a.lineno)
            if isinstance(a.value, _SCALAR):
                todo += [n.id for n in ast.walk(a.value) if isinstance(n, ast.Name)]
    return frozenset(lines)
