"""How fast ``accumguard lint`` reads big training code, and that it stays linear.

Builds files of the given sizes from the lint corpus (``tests/lint_corpus``: every script,
its functions and classes renamed per copy, concatenated until the size is reached) and,
for each size, in one fresh process per measurement, side by side:

* **lint**: process CPU time of ``lint_file`` (all rules, the file's findings counted);
* **parse**: process CPU time of ``ast.parse`` plus one ``ast.walk`` of the same file, the
  floor any AST linter pays, as a yardstick of the machine's speed at that moment.

Printed per size: lint seconds, MB/s, findings, and lint / parse (robust to a loaded
machine where the seconds are not); then the growth of lint from the smallest size to
each larger one against the growth of the size (linear: the two ratios agree; the test
suite checks only that, ``tests/static/test_robustness.py``).

    python benchmarks/bench_lint.py                  # 1 MB and 5 MB, 3 rounds
    python benchmarks/bench_lint.py --sizes 0.5,2 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "lint_corpus"

_LINT = """
import sys, time
from accumguard.static.lint import lint_file
t = time.process_time()
n = len(lint_file(sys.argv[1]))
print(time.process_time() - t, n)
"""

_PARSE = """
import ast, sys, time
src = open(sys.argv[1]).read()
t = time.process_time()
n = sum(1 for _ in ast.walk(ast.parse(src)))
print(time.process_time() - t, n)
"""


def build(size_bytes: int) -> str:
    """Corpus scripts, in name order and round after round, each copy's ``def`` and
    ``class`` names made unique, until ``size_bytes`` is reached."""
    scripts = [p.read_text() for p in sorted(CORPUS.glob("*.py"))]
    if not scripts:
        raise SystemExit(f"no corpus scripts under {CORPUS}: run from a checkout of accumguard")
    parts: list[str] = []
    size = 0
    while size < size_bytes:
        i = len(parts)
        text = scripts[i % len(scripts)].replace("def ", f"def c{i}_").replace("class ", f"class K{i}")
        parts.append(text)
        size += len(text) + 1
    return "\n".join(parts)


def _time(code: str, path: Path) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=900, check=True).stdout.split()
    return float(out[0]), int(out[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,5", help="file sizes in MB, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per size (median)")
    args = ap.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sizes:
            path = Path(tmp) / f"train_{mb}MB.py"
            path.write_text(build(int(mb * 1_000_000)))
            lint, parse, ratio = [], [], []
            findings = 0
            for _ in range(args.rounds):
                t_lint, findings = _time(_LINT, path)
                t_parse, _ = _time(_PARSE, path)
                lint.append(t_lint)
                parse.append(t_parse)
                ratio.append(t_lint / max(t_parse, 1e-9))
            rows.append((mb, statistics.median(lint), statistics.median(ratio), findings))
            print(f"{mb:5.1f} MB  lint {statistics.median(lint):6.1f} s CPU "
                  f"({mb / statistics.median(lint):.2f} MB/s), {findings} findings; "
                  f"parse+walk {statistics.median(parse):5.2f} s; lint / parse "
                  f"{statistics.median(ratio):5.1f} (min {min(ratio):.1f}, max {max(ratio):.1f})",
                  flush=True)
    base_mb, base_t = rows[0][0], rows[0][1]
    for mb, t, _, _ in rows[1:]:
        print(f"{base_mb:g} -> {mb:g} MB: size x{mb / base_mb:.1f}, lint time x{t / base_t:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
