"""Correct loops the old guard flagged (issue 10), single process on real torch: a model
returning ``SimpleNamespace(loss=...)``, the usual ``from torch.nn.utils import
clip_grad_norm_`` (bound before the guard is installed), an fp32 gradient buffer for a bf16
model, a GAN's two optimizers. Each pattern also has its broken twin, which still fails."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.nn.utils import clip_grad_norm_  # the usual alias, bound before any guard exists

from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss
from accumguard.runtime.guard import (
    ClipInsideWindowError,
    WindowOverrunError,
    ZeroGradInsideWindowError,
    guard,
)

K = 4


class NamespaceModel(torch.nn.Module):
    """Returns a plain object with the loss inside (no tensor, dict or dataclass output)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TokenMLP()

    def forward(self, batch: dict[str, torch.Tensor]) -> SimpleNamespace:
        s, n = token_loss(self.net, batch)
        return SimpleNamespace(loss=s / n, tokens=n)


def _data(n: int = 8) -> list:
    return make_rank_batches(seed=0, world_size=1, micro_batches=n)[0]


def test_model_returning_a_namespace_counts_its_backwards() -> None:
    torch.manual_seed(0)
    model = NamespaceModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with guard(model, opt, accumulation_steps=K) as g:
        for i, batch in enumerate(_data()):
            model(batch).loss.backward()
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
    assert g.violations == [] and g.summary()["backward_passes"] == 8
    assert [w.backward_passes for w in g.windows] == [4, 4]


@pytest.mark.parametrize("bug", [None, "clip_every_micro_step"])
def test_clip_alias_imported_before_the_guard_is_seen(bug: str | None) -> None:
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run() -> Any:
        with guard(model, opt, accumulation_steps=K) as g:
            for i, batch in enumerate(_data()):
                token_loss(model, batch)[0].backward()
                if bug or (i + 1) % K == 0:
                    clip_grad_norm_(model.parameters(), 1.0)
                if (i + 1) % K == 0:
                    opt.step()
                    opt.zero_grad()
        return g

    if bug is None:
        assert run().violations == []
        return
    with pytest.raises(ClipInsideWindowError, match=r"window 0, micro-step 0: saw "
                       r"clip_grad_norm_\(\) after 1 of 4 backward passes"):
        run()


@pytest.mark.parametrize(("how", "raises"), [
    ("norm_inf", False), ("value_inf", False), ("norm_kwarg_inf", False), ("norm_finite", True),
])
def test_clip_with_an_infinite_limit_is_a_norm_read(how: str, raises: bool) -> None:
    """``clip_grad_norm_(params, inf)`` after every backward only reads the norm (the
    logging idiom): no F8. The same call with a finite limit, however large, is a clip."""
    import math

    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run() -> Any:
        with guard(model, opt, accumulation_steps=K) as g:
            for i, batch in enumerate(_data()):
                token_loss(model, batch)[0].backward()
                if how == "norm_inf":
                    clip_grad_norm_(model.parameters(), math.inf)
                elif how == "value_inf":
                    torch.nn.utils.clip_grad_value_(model.parameters(), float("inf"))
                elif how == "norm_kwarg_inf":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf"))
                else:
                    clip_grad_norm_(model.parameters(), 1e9)
                if (i + 1) % K == 0:
                    opt.step()
                    opt.zero_grad()
        return g

    if not raises:
        assert run().violations == []
        return
    with pytest.raises(ClipInsideWindowError):
        run()


@pytest.mark.parametrize("bug", [None, "buffer_not_restored"])
def test_fp32_gradient_buffer_for_a_bf16_model(bug: str | None) -> None:
    """Each micro-step moves the bf16 .grad into an fp32 buffer and clears it; the sum goes
    back into .grad before the step. Correct (conservation holds); forgetting to put it back
    leaves only the last micro-batch: F3."""
    torch.manual_seed(0)
    model = TokenMLP().to(torch.bfloat16)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    buf = [torch.zeros_like(p, dtype=torch.float32) for p in params]

    def run() -> Any:
        with guard(model, opt, accumulation_steps=K) as g:
            for i, batch in enumerate(_data()):
                token_loss(model, batch)[0].backward()
                last = (i + 1) % K == 0
                if not last or bug is None:
                    for b, p in zip(buf, params, strict=True):
                        b += p.grad.float()
                    model.zero_grad()  # inside the window, on purpose
                if last:
                    if bug is None:
                        for b, p in zip(buf, params, strict=True):
                            p.grad = b.to(p.dtype)
                    opt.step()
                    opt.zero_grad()
                    for b in buf:
                        b.zero_()
        return g

    if bug is None:
        g = run()
        assert g.violations == [] and g.optimizer_steps == 2
        return
    # bf16 conservation tolerance is 3e-2 (relative, of checksums): on this toy the lost
    # gradient exceeds it in window 0 or 1 depending on the data
    with pytest.raises(ZeroGradInsideWindowError, match=r"\[F3 .*window [01], micro-step 0: "
                       r"saw zero_grad\(\) after 1 of 4 backward passes"):
        run()


def test_gan_guard_counts_only_its_models_backwards() -> None:
    """Guard on the generator (K=2); the discriminator's backward on a detached fake, its
    zero_grad and step belong to another model and optimizer."""
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    disc = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    g_opt = torch.optim.Adam(gen.parameters(), lr=1e-3)
    d_opt = torch.optim.Adam(disc.parameters(), lr=1e-3)

    def run(k: int, steps: int) -> Any:
        with guard(gen, g_opt, accumulation_steps=k) as g:
            for _ in range(steps):
                for _ in range(k):
                    fake = gen(torch.randn(8, 4))
                    disc(fake.detach()).mean().backward()  # D: not the generator's
                    d_opt.step()
                    d_opt.zero_grad()
                    (-disc(fake).mean()).backward()  # G, accumulated over k micro-steps
                g_opt.step()
                g_opt.zero_grad()
        return g

    g = run(2, 3)
    assert g.violations == [] and g.backward_passes == 6 and g.optimizer_steps == 3
    # a generator window of 3 micro-steps for K=2 is still caught, at its third backward
    with pytest.raises(WindowOverrunError, match="backward pass 3 in a window of 2"), \
            guard(gen, g_opt, accumulation_steps=2):
        for _ in range(3):
            fake = gen(torch.randn(8, 4))
            disc(fake.detach()).mean().backward()
            d_opt.step()
            d_opt.zero_grad()
            (-disc(fake).mean()).backward()


def test_gan_attribution_walk_and_its_fallback() -> None:
    """The guard tells its model's backward passes by walking the loss's autograd graph to
    the generator's output (no hook per forward). A discriminator too large for the walk
    (more nodes than its limit) falls back to a pre-hook on the generator's output: both
    count exactly the generator's backwards, and the observer says which reached it."""
    from accumguard.observe import _attribution

    for layers in (1, _attribution.WALK_LIMIT):
        torch.manual_seed(0)
        gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        disc = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)],
                                   torch.nn.Linear(4, 1))
        g_opt = torch.optim.SGD(gen.parameters(), lr=1e-3)
        d_opt = torch.optim.SGD(disc.parameters(), lr=1e-3)
        reached: list[bool | None] = []
        with guard(gen, g_opt, accumulation_steps=2) as g:
            g.observer.add_listener(SimpleNamespace(on_backward=lambda ev, seen=reached:
                                                    seen.append(ev.reached)))
            for _ in range(2):
                for _ in range(2):
                    fake = gen(torch.randn(8, 4))
                    disc(fake.detach()).mean().backward()  # D only
                    d_opt.step()
                    d_opt.zero_grad()
                    # G's loss; with the small D also a second head on the generator's
                    # output (with the large one, only through D: the walk gives up)
                    extra = 0.1 * fake.pow(2).mean() if layers == 1 else 0.0
                    (-disc(fake).mean() + extra).backward()
                g_opt.step()
                g_opt.zero_grad()
        assert reached == [False, True] * 4, (layers, reached)
        assert g.violations == [] and g.backward_passes == 4 and g.optimizer_steps == 2


def test_grouped_checksums_equal_per_parameter_sums() -> None:
    """The conservation checksums group equal-size parameters into one reduction; they
    must equal the per-parameter (sum, even-position sum, abs sum) of every gradient."""
    from accumguard.observe._checksum import checksums

    torch.manual_seed(0)
    shapes = [(3, 5), (15,), (3, 5), (7,), (1,), (300, 300), (2, 2, 2), (8,), (15,), (8,)]
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64 if i == 9
                                             else torch.float32))
              for i, shape in enumerate(shapes)]
    for i, p in enumerate(params):
        if i != 4:  # one gradient left None: its row stays zero
            p.grad = torch.randn(p.shape, dtype=p.dtype)
    got = checksums(params)
    for i, p in enumerate(params):
        if p.grad is None:
            assert got[i].abs().sum() == 0
            continue
        f = p.grad.reshape(-1).double()
        want = torch.stack([f.sum(), f[::2].sum(), f.abs().sum()])
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("divided", [True, False])
def test_a_term_added_to_grad_after_every_backward_is_a_note_not_an_f3(divided: bool) -> None:
    """A weight-decay gradient added to ``.grad`` after each backward: divided by K it is the
    large batch's, in full it counts K times; the guard cannot tell them apart, so neither
    raises (it raised F3 before, also on the divided form) and both are noted as LOSS_SCALE
    (the same decision as watch's, :func:`accumguard.observe._shared_rules.grew`)."""
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with guard(model, opt, accumulation_steps=K) as g:
        for i, batch in enumerate(_data()):
            (token_loss(model, batch)[0] / K).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.grad.add_(p, alpha=0.05 / (K if divided else 1))
            if (i + 1) % K == 0:
                opt.step()
                opt.zero_grad()
    assert g.violations == [] and g.optimizer_steps == 2
    assert {n.kind for n in g.notes} == {"note_grad_grew"}
