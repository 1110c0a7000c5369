"""What every lint rule needs to know about one file, computed once.

:class:`FileContext` walks the tree once (the parent map and the nodes by type),
then answers the questions the rules ask — "which loops are accumulation
windows?", "is this call only reached at the boundary?", "what is this
object?", "which DeepSpeed config does the script use?" — caching each answer
per node or scope so that the whole analysis stays linear in the file size
(a 5 MB script is linted in seconds). Rules never walk the whole tree on their
own; they ask the context. The facts depend on each other — windows on receivers,
guards on boundary flags, accumulation on both — and share one cache, so they are
methods of one object, written in layers: the file index and whole-file facts
(:mod:`._ctx_file`), boundaries and guards (:mod:`._ctx_boundary`), windows
(:mod:`._ctx_windows`), values by name (:mod:`._ctx_values`); the DeepSpeed config
discovery, which depends on nothing else, lives in :mod:`._dsrefs`.

How "inside the accumulation window" is decided (docs/rules.md has the user's
version):

1. A *window* is the innermost loop whose body (not counting nested function or
   class definitions) calls ``.backward(`` (``loss.backward()``,
   ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
   ``engine.backward(loss)``, ``self.manual_backward(loss)``). A function named
   ``training_step``/``train_step`` that calls backward outside any loop is a
   window too: the framework calls it once per micro-batch.
2. A window is an *accumulation* window only when the code shows accumulation:
   an accumulation-like name, a modulo in an ``if`` that gates a step,
   ``no_sync`` or ``accelerator.accumulate`` — in the window, the backward helpers
   it calls, its function, its class (or the module, for top-level loops); for a DeepSpeed engine, a config
   in sight with GA > 1. Names inside an inner loop that only sums losses before
   one backward do not count: that loop is K = 1.
3. A call is *guarded* when an enclosing ``if`` (up to the window) tests a
   boundary, or an earlier ``if <boundary>: continue`` skips it; calls inside
   ``accelerator.accumulate(...)`` are gated by Accelerate.
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import call_attr, dotted, last_part
from accumguard.static.lint._ctx_values import ValueFacts
from accumguard.static.lint._ctx_windows import WindowFacts, WindowQueries

__all__ = ["FileContext", "WindowFacts"]


class FileContext(WindowQueries, ValueFacts):
    """Facts about one parsed file, each computed on first use and cached."""

    def window_k_is_one(self, window: ast.AST) -> bool:
        """A name the window's boundary reads K from holds 1 (``accum_steps = 1``): every
        micro-step is a boundary, nothing accumulates, no loss scale is wrong by K."""
        return any(self.int_value(ast.parse(name, mode="eval").body) == 1
                   for name in self.window_k_names(window))

    def trainer_ga(self) -> tuple[int | None, str]:
        """The Hugging Face Trainer's gradient_accumulation_steps as the file sets it: (value,
        how), value None when it is not in sight (arguments parsed from the command line, a
        ``**config`` the file does not spell); cached."""
        return self._cached("trainer_ga", self.tree, self._trainer_ga)  # type: ignore[no-any-return]

    def _trainer_ga(self) -> tuple[int | None, str]:
        values: set[int | None] = set()
        args_calls = 0
        for call in self.of(ast.Call):
            for k in call.keywords:
                if k.arg == "gradient_accumulation_steps":
                    values.add(self.int_value(k.value))
            if (last_part(dotted(call.func)) or "").endswith("trainingarguments") or call_attr(call) in ("SFTConfig",):
                args_calls += 1
                for k in call.keywords:
                    if k.arg is None:  # `TrainingArguments(**kwargs)`: read when the file spells it
                        spread = self.ds_finder().resolver().resolve(k.value)
                        ga = None if spread is None else spread.get(
                            "gradient_accumulation_steps", None if spread.partial else 1)
                        values.add(ga if type(ga) is int else None)
        for names, value in self.assignments():
            if any(n.endswith(".gradient_accumulation_steps") for n in names):
                values.add(self.int_value(value))
        if not values:
            return (1, "the default 1") if args_calls else (None, "")
        if None in values:
            return None, ""
        top = max(v for v in values if v is not None)
        return top, f"gradient_accumulation_steps = {top}"

    def shows_accumulation(self, window: ast.AST, skip: frozenset[ast.AST] = frozenset()) -> bool:
        """:meth:`WindowQueries.shows_accumulation`, and a Hugging Face ``Trainer`` subclass's own
        ``training_step`` (the Trainer runs it on every micro-batch) while the file's
        ``TrainingArguments`` accumulate (GA > 1 in sight)."""
        return super().shows_accumulation(window, skip) or self.hf_training_step_accumulates(window)

    def window_itself_accumulates(self, window: ast.AST) -> bool:
        """:meth:`WindowQueries.window_itself_accumulates`, or a Hugging Face ``training_step``
        the Trainer accumulates over (a step, zero_grad and backward in it are not K = 1)."""
        return super().window_itself_accumulates(window) or self.hf_training_step_accumulates(window)

    def hf_training_step_accumulates(self, window: ast.AST) -> bool:
        """``window`` is a ``Trainer`` subclass's ``training_step`` and GA > 1 is in sight."""
        if not (isinstance(window, ast.FunctionDef | ast.AsyncFunctionDef) and window.name == "training_step"):
            return False
        cls = self.parents.get(window)
        if not (isinstance(cls, ast.ClassDef)
                and any((last_part(dotted(b)) or "").lower().endswith("trainer") for b in cls.bases)):
            return False
        ga, _ = self.trainer_ga()
        return ga is not None and ga > 1
