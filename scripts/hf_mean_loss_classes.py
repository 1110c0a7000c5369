"""Regenerate ``src/accumguard/static/lint/_hf_mean_loss.py`` from the installed transformers.

The Hugging Face ``Trainer`` hands ``num_items_in_batch`` to a model whose ``forward`` takes
``**kwargs`` and then does not divide the loss by the accumulation steps (it counts the loss
as normalised over the window). Many model classes take ``**kwargs`` but compute their loss
with a plain mean (``CrossEntropyLoss()``, ``MSELoss()``...) that never reads that count:
under the stock Trainer with gradient accumulation their loss reaches the gradient K times
too large and as a mean of per-micro-batch means. This script reads each ``modeling_*.py``
with ``ast`` (nothing is imported) and lists those classes; lint rule AG155 reads the list.

    python scripts/hf_mean_loss_classes.py           # rewrite the module
    python scripts/hf_mean_loss_classes.py --check   # exit 1 when the module is stale
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

_TARGET = Path(__file__).resolve().parents[1] / "src/accumguard/static/lint/_hf_mean_loss.py"
_PLAIN_LOSS = re.compile(
    r"\b(CrossEntropyLoss|MSELoss|BCEWithLogitsLoss|L1Loss|NLLLoss|SmoothL1Loss)\(|"
    r"\b(F|functional)\.(cross_entropy|mse_loss|binary_cross_entropy_with_logits|nll_loss)\(")


def _sets_no_loss_kwargs(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "accepts_loss_kwargs"
                                                 for t in n.targets) for n in cls.body)


#: transformers' shared heads (``modeling_layers.py``) whose ``forward`` takes ``**kwargs``
#: and calls ``self.loss_function`` without them: a plain mean, whatever the count
_GENERIC_MEAN_HEADS = ("GenericForSequenceClassification", "GenericForTokenClassification")


def _loss_function_without_count(src_fn: ast.FunctionDef) -> bool:
    """``forward`` calls ``self.loss_function(...)`` only without ``**kwargs`` and without
    ``num_items_in_batch``: the loss is the library's mean over the micro-batch."""
    calls = [n for n in ast.walk(src_fn) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "loss_function"]
    return bool(calls) and all(
        all(k.arg is not None and k.arg != "num_items_in_batch" for k in c.keywords)
        for c in calls)


def mean_loss_classes(root: Path) -> list[str]:
    """Model classes whose ``forward`` takes ``**kwargs`` and computes a plain mean loss:
    a torch loss without ``self.loss_function`` or ``num_items_in_batch``, or
    ``self.loss_function`` called without the count by a classification head (sequence,
    token, image: its own forward or transformers' shared one; a detection loss's own
    normalisation is not read)."""
    out: set[str] = set()
    for path in sorted(root.glob("models/*/modeling_*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef) or _sets_no_loss_kwargs(cls):
                continue
            fwd = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
            if fwd is None:
                if any((b.id if isinstance(b, ast.Name) else "") in _GENERIC_MEAN_HEADS
                       for b in cls.bases):
                    out.add(cls.name)  # the shared head's forward (see _GENERIC_MEAN_HEADS)
                continue
            if fwd.args.kwarg is None:
                continue
            src = ast.unparse(fwd)
            if "labels" not in src or "num_items_in_batch" in src:
                continue
            if ("loss_function" not in src and _PLAIN_LOSS.search(src)) \
                    or (cls.name.endswith("Classification") and _loss_function_without_count(fwd)):
                out.add(cls.name)
    return sorted(out)


def render(version: str, names: list[str]) -> str:
    body = "".join(f'    "{n}",\n' for n in names)
    return (
        '"""Model classes of transformers whose ``forward`` takes ``**kwargs`` (so the stock\n'
        "``Trainer`` passes ``num_items_in_batch`` and does not divide the loss by the accumulation\n"
        "steps) but compute a plain mean loss that ignores it. Generated from transformers "
        f"{version}\nby ``scripts/hf_mean_loss_classes.py``; do not edit by hand.\"\"\"\n\n"
        f'TRANSFORMERS_VERSION = "{version}"\n\n'
        f"MEAN_LOSS_CLASSES = frozenset({{\n{body}}})\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the module is stale")
    args = parser.parse_args()
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        print("transformers is not installed: nothing to read", file=sys.stderr)
        return 2
    root = Path(spec.origin).parent
    version = re.search(r'__version__ = "([^"]+)"', (root / "__init__.py").read_text())
    text = render(version.group(1) if version else "unknown", mean_loss_classes(root))
    if args.check:
        stale = not _TARGET.exists() or _TARGET.read_text() != text
        print("stale" if stale else "current")
        return 1 if stale else 0
    _TARGET.write_text(text)
    print(f"wrote {_TARGET} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
