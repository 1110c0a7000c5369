"""The architecture is enforced, not only drawn: each layer imports only the layers below it.

Every ``import``/``from ... import`` of an accumguard module is read from the
source (including imports inside functions: a lazy import is still a dependency),
so a new upward edge fails here with the file and line.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "accumguard"

# Bottom (0) to top. A module may import its own layer and any lower one.
LAYERS = {
    "core": 0,
    "static": 1,
    "engines": 2,
    "accumulate": 3,
    "observe": 4,
    "integrations": 5,
    "runtime": 6,
    "watch": 7,
    "verify": 8,
    "invariance": 9,
    "advise": 10,
    "demo": 11,
    "cli": 12,
}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "accumguard":
        return None
    return parts[1] if parts[1] in LAYERS else None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module == "accumguard":
                out += [(node.lineno, f"accumguard.{a.name}") for a in node.names]
    return out


def test_every_package_is_assigned_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS), f"assign a layer to {packages ^ set(LAYERS)}"
    # _moved.py: the package's own plumbing (old import paths -> new), imports nothing
    stray = [p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "_moved.py")]
    assert not stray, f"top-level modules outside any layer: {stray}"


def test_no_upward_imports() -> None:
    violations = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        here = _layer(".".join(rel.parts))
        if here is None:
            continue  # the package __init__ re-exports lazily and may name any layer
        for line, target in _imports(path):
            there = _layer(target)
            if there is not None and LAYERS[there] > LAYERS[here]:
                violations.append(f"{path.relative_to(SRC.parent)}:{line}: {here} imports {target}")
    assert not violations, "upward imports:\n" + "\n".join(violations)


def test_static_imports_without_torch(tmp_path: Path) -> None:
    # A meta-path finder that refuses torch: as if torch were not installed.
    blocker = tmp_path / "block_torch.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, _Block())\n")
    code = ("import block_torch, accumguard.static, accumguard.static.lint, "
            "accumguard.static.dsconfig, accumguard.cli.lint\n"
            "from accumguard.static.lint import lint_source\n"
            "print(len(lint_source('import os\\n')))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC.parent)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_package_import_is_lazy() -> None:
    code = "import sys, accumguard; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_pytest_plugin_costs_nothing_at_startup() -> None:
    # Every pytest session of an environment with accumguard installed loads the plugin:
    # it may add only itself and its package to what pytest already imported (never torch),
    # and its own import time (CPU time, best of 5: the machine is shared) stays <= 0.1 s.
    code = ("import sys, time, pytest; before = set(sys.modules); t = time.process_time(); "
            "import accumguard.verify.pytest_plugin; dt = time.process_time() - t; "
            "print(dt, sorted(set(sys.modules) - before))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60).stdout.split(" ", 1) for _ in range(5)]
    added = ast.literal_eval(runs[0][1])  # the printed list of module names
    assert "torch" not in added, added
    assert all(m.split(".")[0] == "accumguard" for m in added), added
    assert min(float(r[0]) for r in runs) <= 0.1


def _module_graph() -> dict[str, set[str]]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import mod` depends on pkg and, when it is a module, on pkg.mod
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def test_no_import_cycle_between_modules() -> None:
    # Within a layer too: a cycle (even through a TYPE_CHECKING or a lazy import) means two
    # modules should share a third, lower one (as demo/records.py and static/lint/_rule.py do).
    graph = _module_graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
