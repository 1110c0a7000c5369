"""Accelerate on 2 gloo ranks: the Accumulator through a prepared Accelerator equals the fp64
large-batch reference; the plain ``accelerator.backward(token_mean)`` default does not and is
flagged F5 by the checks (its prepared scheduler's W steps per optimizer step are
Accelerate's design: said as info, not F4, as ``accumguard watch`` counts them)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fw_common as fw  # noqa: E402

from accumguard.runtime.launch import run_on_ranks  # noqa: E402

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

K = 4
LR = 0.3
SAMPLES = 40  # 20 micro-batches of 2 -> 10 per rank -> windows of 4, 4 and a partial 2
CLIP = 0.5  # below the gradient norms of this model: clipping is active


def _opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _sched(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def _worker(rank: int, world: int) -> dict[str, Any]:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from accumguard.integrations.accelerate import accumulator, watch

    class Stream(torch.utils.data.IterableDataset):
        """The same samples as a stream without a length."""

        def __iter__(self) -> Any:
            return iter(fw.token_samples(SAMPLES, seed=3))

    out: dict[str, Any] = {}
    for mode in ("exact", "default", "iterable"):
        accel = Accelerator(gradient_accumulation_steps=K, cpu=True)
        model = fw.tiny_llama(0)
        opt = _opt(model.parameters())
        sched = _sched(opt)
        data = Stream() if mode == "iterable" else fw.token_samples(SAMPLES, seed=3)
        loader = DataLoader(data, batch_size=2, shuffle=False)
        model, opt, loader, sched = accel.prepare(model, opt, loader, sched)
        infos: list[logging.LogRecord] = []
        handler = logging.Handler(logging.INFO)
        handler.emit = infos.append  # type: ignore[method-assign]
        logging.getLogger("accumguard").addHandler(handler)
        logging.getLogger("accumguard").setLevel(logging.INFO)
        checks = watch(accel, model, opt, scheduler=sched, every_n_steps=1)
        windows: list[list[dict]] = []
        snaps: list[dict] = []
        if mode in ("exact", "iterable"):
            # the stream also clips (through accelerator.clip_grad_norm_, once per window)
            acc = accumulator(accel, model, opt, scheduler=sched, count_fn=fw.count_tokens,
                              max_grad_norm=CLIP if mode == "iterable" else None)
            for window in acc.windows(loader):
                windows.append([fw.plain(b) for b in window.batches])
                window.run(lambda b, m=model: fw.sum_loss(m, b)[0])
                snaps.append(fw.flat_params(model))
            acc.close()
        else:  # the documented Accelerate loop with a token-mean loss
            current: list[dict] = []
            for batch in loader:
                with accel.accumulate(model):
                    current.append(fw.plain(batch))
                    accel.backward(fw.mean_loss(model, batch))
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                if accel.sync_gradients:
                    windows.append(current)
                    current = []
                    snaps.append(fw.flat_params(model))
        checks.close()
        logging.getLogger("accumguard").removeHandler(handler)
        out[mode] = {"windows": windows, "snaps": snaps, "checked": checks.checked_steps,
                     "norms": [float(r.grad_norm) for r in acc.history
                               if r.grad_norm is not None] if mode != "default" else [],
                     "findings": sorted({f.class_id for f in checks.findings}),
                     "info": [r.getMessage() for r in infos]}
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_on_ranks(_worker, 2, timeout=240)


def _errors(runs: list[dict[str, Any]], mode: str) -> list[float]:
    return fw.update_errors(fw.tiny_llama(0), _opt, _sched,
                            [r[mode]["windows"] for r in runs], runs[0][mode]["snaps"],
                            max_grad_norm=CLIP if mode == "iterable" else None)


@pytest.mark.parametrize("mode", ["exact", "iterable"])
def test_accumulator_through_accelerate_equals_the_reference(runs: list[dict[str, Any]],
                                                             mode: str) -> None:
    sizes = [len(w) for w in runs[0][mode]["windows"]]
    assert sizes == [K, K, 2], sizes  # a partial final window (also for a stream with no len)
    errs = _errors(runs, mode)
    assert max(errs) <= fw.EXACT_TOL, errs
    for r in runs:
        assert r[mode]["findings"] == [], r[mode]["findings"]
        assert r[mode]["checked"] == 3
    if mode == "iterable":
        assert min(runs[0][mode]["norms"]) > CLIP, runs[0][mode]["norms"]  # clipping was active


def test_accelerate_default_token_mean_differs_and_is_flagged(runs: list[dict[str, Any]]) -> None:
    errs = _errors(runs, "default")
    assert max(errs) >= fw.BROKEN_MIN, errs
    for r in runs:
        # F5: each micro-batch's mean divided by K; the prepared scheduler's W steps per
        # optimizer step are Accelerate's design: one step for F4, said once as info
        assert r["default"]["findings"] == ["F5"], r["default"]["findings"]
    said = [m for m in runs[0]["default"]["info"] if "prepared scheduler" in m]
    assert len(said) == 1 and "2 times per optimizer step" in said[0], runs[0]["default"]
