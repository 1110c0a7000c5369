"""A loss built from torch ops only (no recorded loss call: a PPO objective of a policy, a
value and an entropy mean) is a sum of terms too: a mean term not divided by K beside terms
that are is LOSS_SCALE naming the term (blind round 30, writer c: an entropy bonus
subtracted after ``loss / K``); the correct forms say nothing at error level. Recorded
in-process, judged on the recorded windows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.distributions import Categorical

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, ROWS = 4, 3, 12


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every window (the loss record's budget samples a toy's windows by timing)."""
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


class _ActorCritic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(5, 16)
        self.pi = torch.nn.Linear(16, 3)
        self.v = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.pi(h), self.v(h).squeeze(-1)


def _ppo(form: str) -> Callable[[], None]:
    def loop() -> None:
        torch.manual_seed(0)
        model = _ActorCritic()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            for _ in range(K):
                obs = torch.randn(ROWS, 5, generator=g)
                act = torch.randint(0, 3, (ROWS,), generator=g)
                adv, ret = torch.randn(ROWS, generator=g), torch.randn(ROWS, generator=g)
                old = torch.randn(ROWS, generator=g) * 0.1 - 1.0
                logits, values = model(obs)
                d = Categorical(logits=logits)
                ratio = (d.log_prob(act) - old).exp()
                pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
                v = 0.5 * (values - ret).pow(2).mean()
                ent = d.entropy().mean()
                if form == "entropy after /K":  # the bug
                    loss = (pg + 0.5 * v) / K - 0.01 * ent
                elif form == "(pg + v - ent) / K":
                    loss = (pg + 0.5 * v - 0.01 * ent) / K
                elif form == "each / K":
                    loss = pg / K + 0.5 * v / K - 0.01 * ent / K
                elif form == "entropy (c / K)":  # a coefficient that holds the 1/K
                    loss = (pg + 0.5 * v) / K - ent * (0.01 / K)
                else:  # "summed policy": a sum's large-batch meaning is the sum over micro-batches
                    loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum() / K \
                        - 0.01 * ent / K
                loss.backward()
            opt.step()
            opt.zero_grad()

    return loop


def _errors(tmp_path: Path, form: str) -> list[Finding]:
    with recording(tmp_path):
        _ppo(form)()
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_an_entropy_bonus_added_after_the_division_by_k_is_an_error(tmp_path: Path) -> None:
    (f,) = _errors(tmp_path, "entropy after /K")
    assert f.cls == "LOSS_SCALE", f
    assert "not divided by K" in f.title and f"{K}x" in f.title
    assert f"a mean over {ROWS} elements" in f.evidence
    assert "2 terms starting at" in f.evidence and f"divided by K = {K}" in f.evidence
    assert "multiplied by 0.01" in f.evidence and f"of the {K} micro-steps" in f.evidence
    assert "test_term_torch_ops.py" in f.evidence  # the backward's line


@pytest.mark.parametrize("form", ["(pg + v - ent) / K", "each / K", "entropy (c / K)",
                                  "summed policy"])
def test_correct_or_undecidable_forms_say_nothing(tmp_path: Path, form: str) -> None:
    assert _errors(tmp_path, form) == []


# -- a router over every input position beside a causal LM loss over the shifted tokens ----

class _CausalMoE(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(13, 8)
        self.router = torch.nn.Linear(8, 3)
        self.head = torch.nn.Linear(8, 13)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(ids).flatten(0, 1)  # every position: B x T rows
        probs = torch.softmax(self.router(h), -1)
        frac = torch.stack([(probs.argmax(-1) == e).float().mean() for e in range(3)])
        aux = 3 * (frac * probs.mean(0)).sum()
        # transformers' form: two layers' router rows summed, divided by their number (a float)
        second = torch.softmax(self.router(torch.tanh(h)), -1)
        self.aux_layers = 3 * (frac * ((probs.sum(0) + second.sum(0)) / float(2 * len(h)))).sum()
        return self.head(h * probs.max(-1).values[:, None]).view(*ids.shape, 13), aux


def _causal(form: str) -> Callable[[], None]:
    def loop() -> None:
        torch.manual_seed(0)
        model = _CausalMoE()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(2)
        for _ in range(STEPS):
            for _ in range(K):
                ids = torch.randint(0, 13, (3, 8), generator=g)
                logits, aux = model(ids)
                ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                       ids[:, 1:].flatten())
                if form == "layers aux after /K":
                    aux = model.aux_layers
                loss = ce / K + 0.01 * aux if form.endswith("after /K") else (ce + 0.01 * aux) / K
                loss.backward()
            opt.step()
            opt.zero_grad()
        # a large-batch reference phase with its own optimizer, the aux divided by K there
        ref_opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            for _ in range(K):
                ids = torch.randint(0, 13, (3, 8), generator=g)
                logits, aux = model(ids)
                ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                       ids[:, 1:].flatten())
                ((ce + 0.01 * aux) / K).backward()
            ref_opt.step()
            ref_opt.zero_grad()

    return loop


def test_a_router_over_the_unshifted_positions_is_a_micro_batch_mean(tmp_path: Path) -> None:
    """The CE takes 3 x 7 shifted tokens, the router's mean 3 x 8 positions, or 2 layers' of
    them summed and divided by 48 (transformers' MoE loss): the same micro-batch's sequences
    (blind round 31: an FSDP2 MoE LM, an HF Trainer Mixtral). A later reference phase with
    its own optimizer, written right, is judged apart and does not hide the training's."""
    with recording(tmp_path / "bug"):
        _causal("aux after /K")()
    findings, _, _ = analyze(load_recordings(tmp_path / "bug"))
    (f,) = [x for x in findings if x.severity == "error"]
    assert f.cls == "LOSS_SCALE", f
    assert "a mean over 24 rows, the micro-batch's 24 positions (its 21 tokens before the loss " \
           "beside it dropped one position of each of its 3 sequences)" in f.evidence
    assert "multiplied by 0.01 x 3" in f.evidence
    with recording(tmp_path / "layers"):
        _causal("layers aux after /K")()
    findings, _, _ = analyze(load_recordings(tmp_path / "layers"))
    (f,) = [x for x in findings if x.severity == "error"]
    assert "48 rows, 2 x the micro-batch's 24 positions" in f.evidence, f
    with recording(tmp_path / "ok"):
        _causal("(ce + aux) / K")()
    findings, _, _ = analyze(load_recordings(tmp_path / "ok"))
    assert [x for x in findings if x.severity == "error"] == []


def _ppo_params() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = _ActorCritic()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for _ in range(K):
            logits, values = model(torch.randn(ROWS, 5, generator=g))
            d = Categorical(logits=logits)
            loss = (-d.log_prob(torch.randint(0, 3, (ROWS,), generator=g)).mean()
                    + 0.5 * values.pow(2).mean()) / K - 0.01 * d.entropy().mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_a_fault_keeping_the_terms_of_a_loss_without_a_loss_call_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's term rows of a loss built from torch ops are made at the optimizer step,
    inside the user's ``step()``: a raise there switches observation off, is reported as
    accumguard's own failure, and the run is bit-identical (fails with the door's guard
    broken on purpose: hook_method's door in observe/_failsafe.py)."""
    import accumguard.observe._losses as losses

    unobserved = _ppo_params()

    def broken(*args: object, **kwargs: object) -> list[list[object]]:
        raise RuntimeError("injected: term_rows")

    monkeypatch.setattr(losses, "term_rows", broken)
    with recording(tmp_path) as obs:
        params = _ppo_params()
        failure = obs.failure
    assert failure is not None and "term_rows" in failure.error + failure.traceback
    for a, b in zip(params, unobserved, strict=True):
        assert torch.equal(a, b)
    assert list(load_recordings(tmp_path).failures) == [0]
