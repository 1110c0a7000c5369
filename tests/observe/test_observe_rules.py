"""The per-window rules live once, in ``accumguard.observe.rules``: watch re-exports them,
the framework callbacks apply them live; the observer's cheap root/depth tracking keeps
seeing top-level forwards when loss modules are built on every step."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import torch

from accumguard.observe import Observer, rules
from accumguard.watch import _findings as watch_findings


def _record(**kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"kind": "step", "rank": 0, "step": 3, "backwards": 4, "applied": True,
                           "engine": "local", "zero_grads_between": 0, "clip_micros": [],
                           "sync_micros": [], "conservation": None}
    rec.update(kw)
    return rec


def test_watch_uses_the_rules_of_the_observation_layer() -> None:
    assert watch_findings.analyze is rules.analyze
    assert watch_findings.load_recordings is rules.load_recordings


def test_live_findings_name_the_per_window_classes() -> None:
    assert rules.live_findings(_record(), rank=0, k=4) == []
    wiped = {"params": 2, "ok": False, "reason": "wiped", "wiped": 0.7, "received": 0.6, "stale": 0.0}
    got = rules.live_findings(_record(conservation=wiped, zero_grads_between=2), rank=0, k=4)
    assert [(f.cls, f.severity, f.step) for f in got] == [("F3", "error", 4)]
    stale = dict(wiped, reason="stale", stale=0.5)
    assert [f.cls for f in rules.live_findings(_record(conservation=stale), rank=0, k=4)] == ["F7"]
    assert [f.cls for f in rules.live_findings(_record(clip_micros=[1, 4]), rank=0, k=4)] == ["F8"]
    long = rules.live_findings(_record(backwards=6), rank=None, k=4)
    assert [(f.cls, f.rank) for f in long] == [("F13", None)]
    leak = rules.live_findings(_record(backwards=6, data_pass_starts=[2]), rank=0, k=4)
    assert [f.cls for f in leak] == ["F7"]
    ddp_last_off = _record(engine="ddp", sync_micros=[True, True, True, False])
    assert [f.cls for f in rules.live_findings(ddp_last_off, rank=0, k=4)] == ["F11"]
    wasteful = rules.live_findings(_record(engine="ddp", sync_micros=[True] * 4), rank=0, k=4)
    assert [(f.cls, f.severity) for f in wasteful] == [("EXTRA_SYNC", "note")]
    assert rules.live_findings(_record(applied=False), rank=0, k=4) == []


def test_wipe_evidence_numbers_this_steps_backward_passes() -> None:
    # two backwards per micro-step (window 2 micro-steps, 4 backwards): the clears are
    # numbered among the backward passes the checksums saw, never "pass 3 of 2"
    cons = {"params": 2, "ok": False, "reason": "wiped", "wiped": 0.2, "received": 0.3, "stale": 0.0,
            "wipes": [2], "lost": 0.5}
    rec = _record(conservation=cons, zero_grads_between=1, backwards=4,
                  forwards=[1, 0, 1, 0])
    (f,) = rules.live_findings(rec, rank=0, k=2)
    assert "before backward pass(es) 3 of 4" in f.evidence, f.evidence
    assert "about 50% of the window's gradient" in f.evidence
    rescaled = dict(cons, lost=0.0)  # a rescale, not a clear: no share removed is claimed
    (g,) = rules.live_findings(_record(conservation=rescaled), rank=0, k=4)
    assert g.cls == "F3" and "removed" not in g.evidence and "rescale" in g.evidence


def test_token_weights_f5_only_when_counts_differ() -> None:
    k = 4
    counts = [10.0, 30.0, 20.0, 40.0]
    mean_of_means = [[[n, 1.0 / (n * k), 1.0] for n in counts]]  # per-micro-batch mean / K
    verdict = rules.classify_token_weights(mean_of_means, world_size=1,
                                           averages_over_ranks=False, accumulation_steps=k)
    assert verdict is not None and verdict[0] == "F5"
    exact = [[[n, 1.0 / sum(counts), 1.0] for n in counts]]
    assert rules.classify_token_weights(exact, world_size=1, averages_over_ranks=False,
                                        accumulation_steps=k) is None
    equal = [[[25.0, 1.0 / (25.0 * k), 1.0] for _ in counts]]  # equal counts: mean/K is exact
    assert rules.classify_token_weights(equal, world_size=1, averages_over_ranks=False,
                                        accumulation_steps=k) is None


class _Forwards:
    def __init__(self) -> None:
        self.n = 0

    def on_forward(self, ev: Any) -> None:
        self.n += 1


def test_auto_roots_depth_survives_per_step_loss_modules_and_errors() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    class Boom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("boom")

    seen = _Forwards()
    obs = Observer(auto_roots=True, conservation=False)
    obs.add_listener(seen)
    with obs:
        for _ in range(4):
            loss = torch.nn.MSELoss()(model(torch.randn(2, 3)), torch.zeros(2, 1))
            loss.backward()
            gc.collect()  # the freed loss module's id may be reused by the next one
            assert obs._fwd_depth == 0
        with contextlib.suppress(ValueError):
            Boom()(1)
        assert obs._fwd_depth == 0
        model(torch.randn(2, 3)).sum().backward()
    # 5 model forwards + 4 loss modules + Boom, each at the top level; none of the
    # submodules (Linear, ReLU) counted
    assert seen.n == 10, seen.n
    assert obs.step == 0 and obs.backward_total == 5
    assert not model._forward_hooks and not model._forward_pre_hooks  # removed on exit


def test_wasteful_sync_is_titled_by_its_cost_never_correct_beside_an_error() -> None:
    """Issue 23: next to a real F8 error (clip per micro-step) a DDP window that also synced
    every micro-step got a note titled "OK — correct large-batch update" with the fix
    "Nothing to fix". The note names the cost, and no finding of the step claims it correct."""
    rec = _record(engine="ddp", sync_micros=[True] * 4, clip_micros=[1, 2, 3, 4])
    got = rules.live_findings(rec, rank=0, k=4)
    assert [(f.cls, f.severity) for f in got] == [("F8", "error"), ("EXTRA_SYNC", "note")]
    note = got[1]
    assert note.title == ("gradients synchronised on every micro-step: 3 extra all-reduce "
                          "round(s) per optimizer step"), note.title
    assert "no_sync" in note.fix
    for f in got:
        text = " ".join((f.title, f.evidence, f.fix)).lower()
        assert "correct" not in text and "nothing to fix" not in text, f
    some = rules.live_findings(_record(engine="fsdp2", sync_backward=[True, False, True, True]),
                               rank=0, k=4)
    assert [f.title for f in some] == ["gradients synchronised on 2 of 3 non-final micro-steps: "
                                       "2 extra all-reduce round(s) per optimizer step"]
    assert "set_requires_gradient_sync" in some[0].fix
