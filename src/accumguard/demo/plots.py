"""The demo's two pictures (matplotlib, imported only here and only when plotting).

* ``demo-update-error.png``: one panel per engine, the relative error of each
  loop's parameter update against the fp64 large-batch reference, per optimizer
  step, on a log scale. Correct loops sit near 1e-6, under the tolerance line;
  a broken loop sits orders of magnitude above it, whatever its step count (a
  loss curve would hide that: a loop that steps K times as often looks better).
* ``demo-story.png``: the story (:mod:`accumguard.demo.story`), evaluation loss
  against optimizer steps and against samples seen, the final gap annotated.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from accumguard.demo.loops import engine_title

if TYPE_CHECKING:  # pragma: no cover - types only
    from accumguard.demo.records import DemoRow, FrameworkRow
    from accumguard.demo.story import StoryResult
    from accumguard.verify.report import AuditReport

__all__ = ["plot_update_errors", "plot_story", "plot_framework_errors", "UPDATE_ERROR_PNG",
           "STORY_PNG", "FRAMEWORKS_PNG"]

UPDATE_ERROR_PNG = "demo-update-error.png"
STORY_PNG = "demo-story.png"
FRAMEWORKS_PNG = "frameworks-update-error.png"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_update_errors(rows: list[DemoRow], reports: dict[str, Any], engines: tuple[str, ...],
                       out_dir: Path, *, accumulation_steps: int, world_size: int) -> Path:
    """Relative update error per optimizer step, one log-scale panel per engine."""
    plt = _pyplot()
    shown = [e for e in engines
             if any(_has_steps(reports.get(r.key)) for r in rows if r.engine == e)]
    cols = min(3, max(1, len(shown)))
    n_rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.6 * cols, 3.3 * n_rows), squeeze=False)
    for ax, engine in zip(axes.flat, shown, strict=False):
        tol_drawn = False
        n_ok = n_bad = 0
        for r in rows:
            rep = reports.get(r.key)
            if r.engine != engine or not _has_steps(rep):
                continue
            pts = [(s.step + 1, max(s.update_error, 1e-9)) for s in rep.steps
                   if s.update_error is not None]
            if not tol_drawn:
                tol = [(s.step + 1, s.update_tolerance) for s in rep.steps
                       if s.update_tolerance is not None]
                if tol:
                    ax.plot(*zip(*tol, strict=True), color="0.5", ls="--", lw=1,
                            label="tolerance (fp32)")
                    tol_drawn = True
            broken = r.kind == "broken"
            label = r.loop
            if broken:
                label += f" ({r.diagnosis or '?'})"
                if rep.optimizer_steps != rep.reference_steps:
                    label += f", {rep.optimizer_steps} steps vs {rep.reference_steps}"
                color, marker = _BROKEN_COLORS[n_bad % len(_BROKEN_COLORS)], "x"
                n_bad += 1
            else:
                color, marker = _OK_COLORS[n_ok % len(_OK_COLORS)], "os^"[n_ok % 3]
                n_ok += 1
            ax.plot(*zip(*pts, strict=True), ls=":" if broken else "-", lw=2 if broken else 1.2,
                    color=color, marker=marker, ms=6 - 1.5 * (n_ok - 1) if not broken else 5,
                    label=label)
        ax.set_yscale("log")
        ax.set_ylim(1e-8, 10)
        ax.set_title(engine_title(engine), fontsize=9)
        ax.set_xlabel("optimizer step (of the reference)")
        ax.set_ylabel("rel. update error vs reference")
        ax.xaxis.get_major_locator().set_params(integer=True)
        # Between the correct loops (~1e-6) and the broken ones (~1e-1) the panel is empty.
        ax.legend(fontsize=6.5, ncol=2, loc="center", bbox_to_anchor=(0.5, 0.58))
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.suptitle(f"accumguard demo: ‖Δθ_loop − Δθ_ref‖ / ‖Δθ_ref‖ per step "
                 f"(K={accumulation_steps}, W={world_size}); broken loops sit far above",
                 fontsize=10)
    fig.tight_layout()
    path = Path(out_dir) / UPDATE_ERROR_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_OK_COLORS = ("tab:blue", "tab:green", "tab:cyan")
_BROKEN_COLORS = ("tab:red", "darkorange", "purple", "crimson", "saddlebrown")


def _has_steps(rep: Any) -> TypeGuard[AuditReport]:
    """An audit report with steps (``reports`` also holds error dicts and exceptions)."""
    return rep is not None and not isinstance(rep, (dict, BaseException)) and bool(rep.steps)


_STYLE = {
    "large-batch": {"color": "black", "ls": "--", "lw": 3.0, "alpha": 0.55, "zorder": 2},
    "ddp/accumulator": {"color": "tab:blue", "lw": 1.4, "marker": "o", "ms": 3,
                        "markevery": (0, 4)},
    "deepspeed-z2/accumulator": {"color": "tab:green", "lw": 1.4, "marker": "s", "ms": 3,
                                 "markevery": (1, 4)},
    "deepspeed-z2/correct": {"color": "tab:purple", "lw": 1.4, "marker": "^", "ms": 3,
                             "markevery": (2, 4)},
    "deepspeed-z2/bug-F2": {"color": "tab:red", "lw": 2.4},
}


def plot_story(story: StoryResult, out_dir: Path, path: Path | None = None) -> Path:
    """Eval loss against optimizer steps (left) and samples seen (right), one PNG."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    for s in story.series:
        if not s.eval_loss:
            continue
        style = _STYLE.get(s.key, {"lw": 1.2})
        steps = list(range(len(s.eval_loss)))
        left.plot(steps, s.eval_loss, label=s.label, **style)
        right.plot(story.samples(len(s.eval_loss)), s.eval_loss, label=s.label, **style)
    left.set_xlabel("optimizer step")
    right.set_xlabel(f"samples seen (sequences; {story.samples_per_step} per step)")
    left.set_ylabel(f"eval loss ({story.eval_sequences} held-out sequences)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    bad = story.get("deepspeed-z2/bug-F2")
    ref = story.get("large-batch")
    headline = story.headline()
    if bad is not None and ref is not None and bad.eval_loss and headline:
        n = len(bad.eval_loss) - 1
        left.annotate("", xy=(n, ref.eval_loss[-1]), xytext=(n, bad.eval_loss[-1]),
                      arrowprops={"arrowstyle": "<->", "color": "tab:red", "lw": 1.5})
        # Lower left is empty (the curves start high and end at the right); the red
        # double arrow at the last step is the gap the text gives.
        left.text(0.03, 0.05, headline.replace("; ", ";\n"), transform=left.transAxes,
                  ha="left", va="bottom", fontsize=9, color="tab:red",
                  bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red", "alpha": 0.9})
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False,
               title="(the correct runs lie on the reference)", title_fontsize=8)
    fig.suptitle("The seed report's symptom: DeepSpeed ZeRO-2 + hand-written accumulation "
                 f"trains worse\n(same effective batch of {story.samples_per_step} sequences, "
                 f"same LR, K={story.accumulation_steps}, W={story.world_size})", fontsize=10)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    path = path if path is not None else Path(out_dir) / STORY_PNG
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_framework_errors(rows: list[FrameworkRow], out_dir: Path, *, tolerance: float,
                          accumulation_steps: int, world_size: int) -> Path:
    """``accumguard demo --frameworks``: one log-scale panel per framework, the relative
    update error per optimizer step of its broken default and of the accumguard way."""
    plt = _pyplot()
    shown = list(dict.fromkeys(r.framework for r in rows if r.update_errors))
    fig, axes = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 3.6), squeeze=False)
    for ax, fw in zip(axes.flat, shown, strict=True):
        for r in rows:
            if r.framework != fw or not r.update_errors:
                continue
            steps = list(range(1, len(r.update_errors) + 1))
            errs = [max(e, 1e-9) for e in r.update_errors]
            broken = r.run == "broken"
            label = ("default: " if broken else "accumguard: ") + r.short
            if broken and r.classes:
                label += f" [{','.join(r.classes)}]"
            ax.plot(steps, errs, ls=":" if broken else "-", lw=2 if broken else 1.4,
                    marker="x" if broken else "o", color="tab:red" if broken else "tab:blue",
                    label=label)
            n = len(steps)
        ax.axhline(tolerance, color="0.5", ls="--", lw=1, label=f"tolerance {tolerance:g}")
        ax.set_yscale("log")
        ax.set_ylim(1e-8, 10)
        ax.set_xlim(0.8, n + 0.2)
        ax.set_title(_FRAMEWORK_TITLES.get(fw, fw), fontsize=9)
        ax.set_xlabel("optimizer step (last window partial)")
        ax.set_ylabel("rel. update error vs fp64 reference")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7, loc="center", bbox_to_anchor=(0.5, 0.55))
    fig.suptitle(f"accumguard demo --frameworks: ‖Δθ − Δθ_ref‖ / ‖Δθ_ref‖ per step "
                 f"(K={accumulation_steps}, W={world_size}, uneven token counts)", fontsize=10)
    fig.tight_layout()
    path = Path(out_dir) / FRAMEWORKS_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_FRAMEWORK_TITLES = {"transformers": "transformers Trainer", "lightning": "Lightning",
                     "accelerate": "Accelerate"}
