"""AG105's hand-synchronised shape (F8): a clip before the script's own all-reduce.

A script that synchronises gradients itself (``dist.all_reduce`` of the accumulated
``.grad`` or of a flat bucket of them, averaged or not) and clips before that call clips
each rank's own gradient by its own norm: the ranks' contributions are rescaled by different
factors before they are combined, and the global gradient's norm is never the one clipped.
The large batch clips the synchronised gradient once. Judged when the clip and the call that
reaches the all-reduce (directly, or through a function or method of the file) are in one
function, the clip first, and the next optimizer step after the clip comes after them both; not under a DDP/FSDP
wrapper (whose gradients are synchronised inside the backward).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import CLIP_FUNCS, FUNCS, call_attr
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._rankavg import grad_all_reduces
from accumguard.static.lint.families.hookclip import reads_only

__all__ = ["clip_before_hand_sync"]


def _sync_calls(ctx: FileContext) -> dict[ast.Call, str]:
    """Each call that all-reduces gradients by hand, or runs a function of the file that
    does (one level), with the words for it."""
    out: dict[ast.Call, str] = {}
    holders: set[str] = set()
    for call in grad_all_reduces(ctx):
        out[call] = f"`{ast.unparse(call)}`"
        fn = ctx.enclosing(call, FUNCS)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            holders.add(fn.name)
    for call in ctx.of(ast.Call):
        name = call_attr(call)
        if name in holders and ctx.enclosing(call, FUNCS) is not None:
            out[call] = f"`{ast.unparse(call)}`, which all-reduces the gradients"
    return out


@rule("AG105")
def clip_before_hand_sync(ctx: FileContext) -> Iterator[Finding]:
    if ctx.ddp_wrapped or not ctx.is_training_script():
        return
    syncs = _sync_calls(ctx)
    if not syncs:
        return
    for clip in ctx.of(ast.Call):
        if call_attr(clip) not in CLIP_FUNCS or call_attr(clip) == "unscale_" or reads_only(clip):
            continue
        fn = ctx.enclosing(clip, FUNCS)
        if fn is None:
            continue
        steps = [n.lineno for n in ctx.local_nodes(fn) if isinstance(n, ast.Call)
                 and call_attr(n) == "step" and n.lineno > clip.lineno]
        if not steps:
            continue
        # between the clip and the next step (another optimizer's sync after it is not this
        # clip's: a GAN clips D and steps it before G's window)
        later = [s for s in syncs if ctx.enclosing(s, FUNCS) is fn
                 and clip.lineno < s.lineno < min(steps) and not _inside(clip, s)]
        if not later:
            continue
        sync = min(later, key=lambda s: s.lineno)
        yield ctx.finding(
            "AG105",
            clip,
            f"`{ast.unparse(clip.func)}` runs before {syncs[sync]} (line {sync.lineno}): each "
            "rank clips its own gradient by its own norm before the ranks' gradients are "
            "combined, so they are rescaled by different factors and the synchronised "
            "gradient's norm is never the one clipped",
            fix="synchronise first, then clip once (the synchronised gradient, right before "
                "the optimizer step)",
        )


def _inside(clip: ast.Call, sync: ast.Call) -> bool:
    return any(n is clip for n in ast.walk(sync))
