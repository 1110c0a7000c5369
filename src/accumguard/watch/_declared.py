"""What K the training script itself declares: a static read (stdlib ``ast``) of the
command's ``.py`` file, for ``accumguard watch`` when no ``--accumulation-steps`` is given.

Why: a run that steps every micro-step (F1) shows windows of one backward, so a K
*inferred* from the run is 1 and the bug is invisible. The script usually says what it
meant: ``gradient_accumulation_steps = 8``, ``p.add_argument("--grad-accum", default=4)``,
a dataclass field ``accumulation_steps: int = 4``, ``accum_iter = 40 // world_size``
(nanoGPT), and ``loss = loss / grad_accum``. This module finds such a declaration, its
value for *this* command (command-line arguments ``--name V``/``--name=V`` and the
environment override a default; ``world_size``-like names take the run's world size),
whether the loss is divided by it, and where (``path:line``). Nothing is imported or
executed; a value that cannot be worked out statically is reported as unknown, and the
findings then stay notes.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accumguard.static.lint._ast import dotted, last_part

__all__ = ["ScriptK", "declared_k", "dropped_accumulation_option", "script_lint_errors",
           "script_of_command"]

# K-like names (matched on the last part of a dotted name, case-insensitive).
_K_NAME = re.compile(
    r"^((n|num)_)?(grad(ient)?_?)?accum(ulation|ulate)?(_grad)?"
    r"(_steps?|_iters?|_iterations|_every|_freq|_batches|_count|_micro_?steps)?$"
    r"|^(grad(ient)?_)?acc(_steps?|_iters?)$|^grad(ient)?_acc$|^ga_steps$|^update_freq$",
    re.IGNORECASE)
# A bare K/ACCUM is a K only when the loss is divided by it.
_WEAK_K_NAME = re.compile(r"^(k|num_micro_steps|micro_steps)$", re.IGNORECASE)
_WORLD_NAME = re.compile(r"world_size|world|nproc|num_gpus|n_gpus|ngpus|num_processes",
                         re.IGNORECASE)
_LAUNCHER_MODULES = {"torch.distributed.run", "torch.distributed.launch",
                     "deepspeed.launcher.runner", "deepspeed", "accelerate.commands.launch",
                     "accelerate.commands.accelerate_cli", "accelerate"}
_LOSS_NAME = re.compile(r"loss", re.IGNORECASE)


@dataclass(frozen=True)
class ScriptK:
    """A K the script declares."""

    name: str
    value: int | None  # None: could not be worked out statically
    path: str
    line: int
    how: str  # "assignment", "argparse default", "command line --x 4", ...
    divides_loss: bool  # the script divides a loss by this name
    divide_line: int | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def describe(self) -> str:
        value = "unknown" if self.value is None else str(self.value)
        text = f"{self.name} = {value} declared in the script ({self.where}, {self.how})"
        if self.divides_loss:
            text += f"; the loss is divided by it (line {self.divide_line})"
        return text


def script_of_command(command: Sequence[str], cwd: str | None = None
                      ) -> tuple[Path, list[str]] | None:
    """The user's script in COMMAND and the arguments it gets (``python x.py``,
    ``torchrun ... x.py``, ``deepspeed x.py``, ``accelerate launch x.py``, ``python -m m``)."""
    base = Path(cwd or os.getcwd())
    i = 0
    while i < len(command):
        tok = command[i]
        if tok == "-m" and i + 1 < len(command):
            mod = command[i + 1]
            if mod not in _LAUNCHER_MODULES:
                path = _module_file(mod, base)
                return (path, list(command[i + 2:])) if path is not None else None
            i += 2
            continue
        if tok.endswith(".py"):
            path = Path(tok) if Path(tok).is_absolute() else base / tok
            if path.is_file():
                return path, list(command[i + 1:])
        i += 1
    return None


def _module_file(mod: str, base: Path) -> Path | None:
    parts = mod.split(".")
    for entry in [str(base), *sys.path]:
        root = Path(entry or ".").joinpath(*parts)
        for cand in (root.with_suffix(".py"), root / "__main__.py"):
            if cand.is_file():
                return cand
    return None


def declared_k(command: Sequence[str], *, world: int = 1,
               environ: Mapping[str, str] | None = None, cwd: str | None = None
               ) -> ScriptK | None:
    """The K the command's script declares (see the module docstring), or None."""
    found = script_of_command(command, cwd)
    if found is None:
        return None
    path, args = found
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    return _Reader(tree, str(path), args, world,
                   os.environ if environ is None else environ).result()


def _name_of(node: ast.AST) -> str | None:
    """The last part of a name-like node (``x``, ``args.x``, ``cfg["x"]``)."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        return node.slice.value
    name = dotted(node)
    return name.rsplit(".", 1)[-1].rstrip("()") if name else None


def _builds_object(value: ast.AST) -> bool:
    """``accum = GradAccumulator(opt, cfg["accum"])``: an instance of a class (a capitalised
    callable), not a count; it does not rebind the K of the same name."""
    if not isinstance(value, ast.Call):
        return False
    name = (dotted(value.func) or "").rsplit(".", 1)[-1]
    return bool(name) and name[0].isupper()


def _is_k_name(name: str | None, weak: bool = False) -> bool:
    if not name:
        return False
    return bool(_K_NAME.match(name) or (weak and _WEAK_K_NAME.match(name)))


class _Reader:
    def __init__(self, tree: ast.Module, path: str, args: list[str], world: int,
                 environ: Mapping[str, str]) -> None:
        self.tree = tree
        self.path = path
        self.args = args
        self.world = max(1, world)
        self.environ = environ
        self.ints: dict[str, int] = {}  # simple int bindings seen so far (for evaluation)
        # name -> list of (line, value or None, how)
        self.decls: dict[str, list[tuple[int, int | None, str]]] = {}
        self.divided: dict[str, int] = {}  # K-like name -> line where a loss is divided by it
        self.modded: set[str] = set()  # names used in a boundary test (x % K)
        self.options: dict[str, list[str]] = {}  # argparse dest -> its option strings

    # -- reading ---------------------------------------------------------------------------
    def result(self) -> ScriptK | None:
        nodes = sorted((n for n in ast.walk(self.tree) if hasattr(n, "lineno")),
                       key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        for node in nodes:
            self._visit(node)
        names = [n for n in self.decls if _is_k_name(n) or n in self.divided]
        if not names:
            return None
        names.sort(key=lambda n: (n not in self.divided, n not in self.modded,
                                  not _is_k_name(n), self.decls[n][0][0]))
        name = names[0]
        line, _v, how = next((d for d in self.decls[name] if not d[2].startswith("augmented")),
                             self.decls[name][0])
        value = self._current(name)  # later statements update the value
        if how == "assignment":  # nanoGPT's configurator: --name=V on the command line
            override = self._command_line(name)
            if override is not None:
                value, how = override
        return ScriptK(name=name, value=value, path=self.path, line=line, how=how,
                       divides_loss=name in self.divided, divide_line=self.divided.get(name))

    def _visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for tgt in node.targets:
                self._bind(tgt, node.value, node.lineno, "assignment")
                if (isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Div)
                        and _LOSS_NAME.search(_name_of(tgt) or "")):
                    self._divides(node.value.right, node.lineno)  # loss = ce(...) / K
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            value = node.value
            if isinstance(value, ast.Call) and dotted(value.func) in ("field",
                                                                      "dataclasses.field"):
                value = next((kw.value for kw in value.keywords if kw.arg == "default"), value)
            self._bind(node.target, value, node.lineno, "annotated default")
        elif isinstance(node, ast.AugAssign):
            name = _name_of(node.target)
            if _is_k_name(name, weak=True) and name in self.decls:
                op = type(node.op).__name__
                self.decls[name].append((node.lineno, self._eval(node.value),
                                         f"augmented {op}"))
            elif isinstance(node.op, ast.Div) and _LOSS_NAME.search(_name_of(node.target) or ""):
                self._divides(node.value, node.lineno)
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div) and (self._lossy(node.left)
                                                  or _is_k_name(_name_of(node.right))):
                self._divides(node.right, node.lineno)  # a true-division by a K-named value
            elif isinstance(node.op, ast.Mod):
                name = _name_of(node.right)
                if name:
                    self.modded.add(name)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            for arg, default in zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=False):
                if _is_k_name(arg.arg):
                    self._add(arg.arg, node.lineno, self._eval(default), "function default")
            for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=False):
                if kw_default is not None and _is_k_name(arg.arg):
                    self._add(arg.arg, node.lineno, self._eval(kw_default), "function default")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=False):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                        and _is_k_name(key.value):
                    self._add(key.value, node.lineno, self._eval(value), "dict entry")

    def _lossy(self, node: ast.AST) -> bool:
        return any(_LOSS_NAME.search(n) for n in _names(node))

    def _divides(self, divisor: ast.AST, line: int) -> None:
        name = _name_of(divisor)
        if name is None and isinstance(divisor, ast.Call):  # float(K), int(args.k)
            name = _name_of(divisor.args[0]) if len(divisor.args) == 1 else None
        if _is_k_name(name, weak=True):
            assert name is not None
            self.divided.setdefault(name, line)

    def _call(self, node: ast.Call) -> None:
        func = dotted(node.func) or ""
        attr = last_part(func)
        if attr in ("div", "div_") and node.args and self._lossy(node.func):
            self._divides(node.args[0], node.lineno)
        if attr == "add_argument":
            opts = [a.value for a in node.args if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)]
            dest = next((kw.value.value for kw in node.keywords if kw.arg == "dest"
                         and isinstance(kw.value, ast.Constant)), None)
            longs = [o for o in opts if o.startswith("--")] or opts
            if dest is None and longs:
                dest = longs[0].lstrip("-").replace("-", "_")
            if isinstance(dest, str) and _is_k_name(dest, weak=bool(opts)):
                default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
                value = self._eval(default) if default is not None else None
                self._add(dest, node.lineno, value, "argparse default", options=opts)
            return
        for kw in node.keywords:  # Accelerator(gradient_accumulation_steps=4), Trainer(...)
            if kw.arg and _is_k_name(kw.arg):
                self._add(kw.arg, node.lineno, self._eval(kw.value), f"{attr or 'call'}("
                          f"{kw.arg}=...)")

    def _bind(self, target: ast.AST, value: ast.AST, line: int, how: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            # ``MICRO, K, STEPS = 4, 4, 10``: bind element-wise when the shapes match
            if (isinstance(value, (ast.Tuple, ast.List))
                    and len(value.elts) == len(target.elts)):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._bind(t, v, line, how)
            return
        name = _name_of(target)
        if name is None:
            return
        val = self._eval(value)
        if val is not None and isinstance(target, ast.Name):
            self.ints[name] = val
        if _is_k_name(name, weak=True) and not _builds_object(value):
            self._add(name, line, val, how)

    def _add(self, name: str, line: int, value: int | None, how: str,
             options: Sequence[str] = ()) -> None:
        if options:
            self.options[name] = list(options)
        if how in ("argparse default", "annotated default", "function default"):
            override = self._command_line(name)
            if override is not None:
                value, how = override
        self.decls.setdefault(name, []).append((line, value, how))

    def _current(self, name: str) -> int | None:
        """The value of a declared name after every statement read so far."""
        value: int | None = None
        for _ln, v, h in self.decls[name]:
            if h.startswith("augmented"):
                value = None if value is None or v is None else _apply(h, value, v)
            else:
                value = v
        return value

    # -- values ------------------------------------------------------------------------------
    def _eval(self, node: ast.AST | None) -> int | None:
        """An int expression: literals, known names, world size, + - * // and exact /."""
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                return None
            if isinstance(v, int):
                return v
            if isinstance(v, str) and v.strip().isdigit():
                return int(v)
            return None
        if isinstance(node, ast.Name | ast.Attribute | ast.Subscript):
            name = _name_of(node) or ""
            if _WORLD_NAME.search(name):
                return self.world
            if isinstance(node, ast.Name) and node.id in self.ints:
                return self.ints[node.id]
            if name in self.decls:  # an alias of a declared K: K = args.grad_accum
                return self._current(name)
            return None
        if isinstance(node, ast.Call):
            func = dotted(node.func) or ""
            if func in ("int", "max", "min") and node.args:
                vals = [self._eval(a) for a in node.args]
                if any(v is None for v in vals):
                    return None
                ints = [v for v in vals if v is not None]
                return {"int": ints[0], "max": max(ints), "min": min(ints)}[func]
            if func.endswith(("environ.get", "getenv")) and node.args:  # env override
                key = node.args[0]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    if key.value in self.environ and self.environ[key.value].strip().isdigit():
                        return int(self.environ[key.value])
                    if _WORLD_NAME.search(key.value):
                        return self.world
                return self._eval(node.args[1]) if len(node.args) > 1 else None
            if func.endswith("get_world_size"):
                return self.world
            return None
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left), self._eval(node.right)
            if a is None or b is None:
                return None
            return _apply(f"augmented {type(node.op).__name__}", a, b)
        return None

    def _command_line(self, name: str) -> tuple[int | None, str] | None:
        """``--name V`` / ``--name=V`` (or any of the argparse option strings) in the
        script's arguments overrides the default."""
        opts = list(self.options.get(name, []))
        opts += [f"--{name}", f"--{name.replace('_', '-')}"]
        for i, arg in enumerate(self.args):
            for opt in opts:
                if arg == opt and i + 1 < len(self.args):
                    raw = self.args[i + 1]
                elif arg.startswith(opt + "="):
                    raw = arg[len(opt) + 1:]
                else:
                    continue
                value = int(raw) if raw.strip().isdigit() else None
                return value, f"command line {opt} {raw}"
        for arg in self.args:  # nanoGPT's configurator: `python train.py config/x.py`
            if arg.endswith(".py") and not arg.startswith("-"):
                found = _assigned_in(Path(arg), name)
                if found is not None:
                    return found
        return None


def _assigned_in(path: Path, name: str) -> tuple[int | None, str] | None:
    """A top-level ``name = <int>`` in a config file the script executes."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            v = node.value
            value = v.value if isinstance(v, ast.Constant) and isinstance(v.value, int) \
                and not isinstance(v.value, bool) else None
            return value, f"config file {path}:{node.lineno}"
    return None


def _names(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
    return out


def _apply(how: str, a: int, b: int) -> int | None:
    op = how.split()[-1]
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mult":
        return a * b
    if op == "FloorDiv":
        return a // b if b else None
    if op == "Div":
        return a // b if b and a % b == 0 else None
    return None


def dropped_accumulation_option(command: Sequence[str], cwd: str | None = None
                                ) -> tuple[str, Any] | None:
    """What lint says (AG187, AG191, AG322, AG335, AG347 at error level) when the command's script declares
    an accumulation K that never reaches what accumulates: an option the config its loop
    reads filters out (a dataclass filtered to its fields, ``parse_dict(allow_extra_keys=
    True)``, a config filtered to a constructor's signature), an Accelerator built without it around ``accumulate()``, a per-rank count
    divided by the world size; the run then uses 1. (the text with the script's line, the lint finding), or None when the
    script cannot be read or says no such thing."""
    found = script_lint_errors(command, cwd)
    hits = [] if found is None else [f for f in found[1]
                                     if f.code in ("AG187", "AG191", "AG322", "AG335", "AG347")]
    if found is None or not hits:
        return None
    return f"{found[0].name}:{hits[0].line}: {hits[0].evidence}", hits[0]


def script_lint_errors(command: Sequence[str], cwd: str | None = None,
                       levels: tuple[str, ...] = ("error",)) -> tuple[Path, list[Any]] | None:
    """The command's script and what lint says of it at the severities ``levels`` (error by
    default; ``watch`` keeps some of it when the run confirms it); None when the script
    cannot be found, read or parsed."""
    from accumguard.static.lint import lint_source

    found = script_of_command(command, cwd)
    if found is None:
        return None
    try:
        text = found[0].read_text(encoding="utf-8")
        return found[0], [f for f in lint_source(text)
                          if str(getattr(f.severity, "value", f.severity)) in levels]
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
