"""A term not divided by K beside a main loss normalised over the window on DDP (issue 25
item 2): 2 gloo ranks, K micro-steps; the main term is a token sum (``ignore_index``)
times W divided by the window's all-reduced token count (its tokens weigh 1 in total over
the window only across ranks: each rank's own total differs), and a PaLM-style z-loss (a
masked mean over the micro-batch's valid tokens, or a mean node) is added in every
backward without a division by K: LOSS_SCALE naming the term; divided by K it is a mean of
per-micro-batch means (F5). The correct twins (the z-term normalised like the main term, a
sum, a learned coefficient, present in only some backwards) say nothing at error level, the watched run is bit-identical, a
term divided by the main call's count is never judged, and the masked z-loss is found in
one process too.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, V, B, T = 4, 13, 3, 5
FORMS = ("bug masked", "bug mean", "means /K", "ok global", "ok sum", "ok learned coef",
         "ok some backwards", "main over K", "scale both", "ok scale main",
         "bug masked clipped", "ok global clipped", "world around")


class _LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)
        self.head = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)))


def _rank(rank: int, world: int, path: str) -> dict[str, dict[str, torch.Tensor]]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    out = {}
    for watched, form in [(True, f) for f in FORMS] + [(False, "bug masked")]:
        torch.manual_seed(0)
        model = DDP(_LM())
        coef = torch.nn.Parameter(torch.tensor(1e-3))  # learned, outside DDP
        opt = torch.optim.SGD([*model.parameters(), coef], lr=0.1)
        g = torch.Generator().manual_seed(11 + rank)
        sub = Path(path) / form.replace(" ", "_").replace("/", "")
        with recording(sub) if watched else contextlib.nullcontext():
            for _ in range(2):
                batches = []
                for _ in range(K):
                    x = torch.randint(0, V, (B, T), generator=g)
                    y = torch.randint(0, V, (B, T), generator=g)
                    y[torch.rand(B, T, generator=g) < 0.4] = -100  # varied valid counts
                    batches.append((x, y))
                n_global = torch.tensor(float(sum(int((y != -100).sum()) for _, y in batches)))
                dist.all_reduce(n_global)
                for m, (x, y) in enumerate(batches):
                    with model.no_sync() if m < K - 1 else contextlib.nullcontext():
                        logits = model(x).view(-1, V)
                        yf = y.view(-1)
                        main = F.cross_entropy(logits, yf, reduction="sum",
                                               ignore_index=-100) * world / n_global
                        mask = (yf != -100).float()
                        z = torch.logsumexp(logits, -1) ** 2
                        term = {
                            "bug masked": 1e-3 * (z * mask).sum() / mask.sum(),
                            "bug masked clipped": 1e-3 * (z * mask).sum() / mask.sum(),
                            "ok global clipped": 1e-3 * (z * mask).sum() * world / n_global,
                            "bug mean": 1e-3 * z.mean(),
                            "means /K": 1e-3 * (z * mask).sum() / mask.sum() / K,
                            "ok global": 1e-3 * (z * mask).sum() * world / n_global,
                            "ok sum": 1e-3 * (z * mask).sum(),
                            "ok learned coef": coef * ((z * mask).sum() / mask.sum()),
                            "ok some backwards": 1e-3 * (z * mask).sum() / mask.sum(),
                        }.get(form, 1e-3 * (z * mask).sum() / mask.sum())
                        loss = main + term if form != "ok some backwards" or m == 0 else main
                        if form == "main over K":  # as an engine dividing by its GA does
                            loss = loss / K
                        zm = 1e-3 * (z * mask).sum() / mask.sum()
                        if form == "scale both":  # W x K meant for the CE, then Lightning's /K
                            loss = (main / world + zm) * (world * K) / K
                        if form == "ok scale main":
                            loss = (main * K + zm) / K
                        if form == "world around":  # the HF Trainer's x num_processes
                            loss = (main / world + zm) * world
                        loss.backward()
                if form.endswith("clipped"):  # a clip that always bites: c < 1
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
                if coef.grad is not None:  # outside DDP: averaged by hand (else F10)
                    dist.all_reduce(coef.grad)
                    coef.grad.div_(world)
                opt.step()
                opt.zero_grad()
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        out[form if watched else "unwatched"] = state
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, list[dict[str, dict[str, torch.Tensor]]]]:
    from accumguard.runtime.launch import run_on_ranks

    path = tmp_path_factory.mktemp("zloss")
    return path, run_on_ranks(_rank, 2, (str(path),), timeout=600)


@pytest.fixture
def runs(ranks: tuple[Path, list[dict[str, dict[str, torch.Tensor]]]]) -> Path:
    return ranks[0]


def test_the_watched_bug_is_bit_identical_to_the_unwatched_run(
        ranks: tuple[Path, list[dict[str, dict[str, torch.Tensor]]]]) -> None:
    for states in ranks[1]:
        watched, plain = states["bug masked"], states["unwatched"]
        assert all(torch.equal(watched[k], plain[k]) for k in plain)


def _errors(path: Path, form: str) -> list:
    findings, _, _ = analyze(load_recordings(path / form.replace(" ", "_").replace("/", "")))
    return [f for f in findings if f.severity == "error"]


@pytest.mark.parametrize("form", [f for f in FORMS if f.startswith("bug")])
def test_a_z_loss_not_divided_by_k_beside_a_window_normalised_sum_is_an_error(
        runs: Path, form: str) -> None:
    errors = _errors(runs, form)
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    (f,) = errors
    assert "not divided by K" in f.title and "4x" in f.title, f.title
    assert "LogsumexpBackward0" in f.evidence or "PowBackward0" in f.evidence, f.evidence
    assert "multiplied by 0.001" in f.evidence, f.evidence
    assert "1 in total over each window" in f.evidence, f.evidence
    assert "all-reduced" in f.fix, f.fix


@pytest.mark.parametrize("form", [f for f in FORMS if f.startswith("ok")])
def test_correct_z_loss_twins_on_ddp_are_silent(runs: Path, form: str) -> None:
    assert _errors(runs, form) == []


def test_a_masked_mean_term_divided_by_k_on_ddp_is_a_mean_of_means(runs: Path) -> None:
    """The z-term a masked mean over each micro-batch's valid tokens divided by K, beside the
    CE normalised by the window's all-reduced count: its tokens weigh 1/(K x W x their
    micro-batch's count), not 1/N as the CE's do (blind round 35 c_b02's mechanism): F5."""
    errors = _errors(runs, "means /K")
    assert [f.cls for f in errors] == ["F5"], errors
    assert "mean of per-micro-batch means" in errors[0].title


def test_a_term_divided_by_the_main_calls_count_is_not_judged(runs: Path) -> None:
    """The z-term normalised like the main term (by the window's all-reduced count): were
    that count a multiple of the micro-batch's rows that is no multiple of K (75 = 5 x 15
    here, the recording's 72 rewritten), it could pass for a mean over rows; a divisor the
    main call shares is never judged."""
    from accumguard.observe._records import window_lines
    from accumguard.observe._term_rules import term_scale_findings

    rec = load_recordings(runs / "ok_global")
    windows = window_lines(rec.steps[0])
    masses = {}
    for w in windows:
        for t in w["terms"]:
            if t[0] == "term":
                t[4] = [["/", 75.0] if op == "/" else [op, c] for op, c in t[4]]
                if t[7] is not None:
                    masses[int(w["step"])] = {(str(t[7]), int(t[8])): (1.0, 1e-3)}
    assert len(masses) == len(windows) == 2
    assert term_scale_findings(0, windows, masses) == []


@pytest.mark.parametrize("form", ["bug", "means", "ok"])
def test_a_masked_z_loss_beside_a_mean_over_k_in_one_process(tmp_path: Path,
                                                                form: str) -> None:
    """One process: the CE summed over the valid tokens divided by the window's count
    (``ignore_index``) beside the masked z-loss: not divided by K is LOSS_SCALE; divided by
    K it is a mean of per-micro-batch means over uneven counts (F5, as the CE itself would
    be); normalised by the window's count like the CE, silent."""
    torch.manual_seed(0)
    model = _LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    with recording(tmp_path):
        for _ in range(3):
            batches = []
            for _ in range(K):
                x = torch.randint(0, V, (B, T), generator=g)
                y = torch.randint(0, V, (B, T), generator=g).view(-1)
                y[torch.rand(B * T, generator=g) < 0.4] = -100
                batches.append((x, y))
            n = sum(int((y != -100).sum()) for _, y in batches)
            for x, y in batches:
                logits = model(x).view(-1, V)
                mask = (y != -100).float()
                z_sum = 1e-3 * (torch.logsumexp(logits, -1) ** 2 * mask).sum()
                z = z_sum / mask.sum()
                ce = F.cross_entropy(logits, y, reduction="sum", ignore_index=-100) / n
                (ce + {"bug": z, "means": z / K, "ok": z_sum / n}[form]).backward()
            opt.step()
            opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp_path))
    errors = [f for f in findings if f.severity == "error"]
    expected = {"bug": ["LOSS_SCALE"], "means": ["F5"], "ok": []}[form]
    assert [f.cls for f in errors] == expected, findings
    if form == "bug":
        assert "masked mean over the micro-batch's valid tokens" in errors[0].evidence


def test_a_window_normalised_term_divided_by_k_as_well_is_an_error(runs: Path) -> None:
    """The whole loss divided by K (as DeepSpeed's engine.backward does) while its main term
    is already normalised by the window's all-reduced count: that term weighs 1/K in total
    over the ranks (blind round 28 b_b04); the z-term beside it, a mean divided by K, is right."""
    (f,) = _errors(runs, "main over K")
    assert f.cls == "LOSS_SCALE" and f"weighs 1/{K}" in f.title, f
    assert "test_term_window_ddp.py" in f.evidence and f"{K}x too small" in f.evidence, f.evidence


def test_a_scale_meant_for_the_window_normalised_term_applied_to_a_mean_is_an_error(
        runs: Path) -> None:
    """``(ce_sum / n_global + z) * W * K`` then the engine's /K: right for the CE, but the
    z-loss, a per-micro-batch mean, weighs W x K its coefficient (blind round 28 c_b04);
    the scale applied to the CE alone is silent."""
    (f,) = _errors(runs, "scale both")
    assert f.cls == "LOSS_SCALE" and f"weighs {2 * K}x" in f.title, f
    assert "the constants above the sum" in f.evidence, f.evidence
    assert _errors(runs, "ok scale main") == []


def test_a_clip_after_the_window_does_not_hide_the_term(runs: Path) -> None:
    """The same z-term bug with a norm clip that bites after every window (its factor is in
    what the optimizer receives): the ledger divides the clip's own factor out (the large
    batch clips by its own norm), so the term is still judged, and the correct twin stays
    silent (blind round 39 a_b01: an HF Trainer run clipping at 1.0 hid its z-loss)."""
    errors = _errors(runs, "bug masked clipped")
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert "4x" in errors[0].title, errors[0].title
    assert _errors(runs, "ok global clipped") == []


def test_a_world_factor_around_the_sum_weighs_the_mean_term_k_times_w(runs: Path) -> None:
    """``(ce_sum / n_global + coef * z_mean) * W``: the HF Trainer's multiplication by the
    number of processes around a loss whose other term is a micro-batch mean: that term
    weighs K x W = 8 x its coefficient, and the title says so (not K x)."""
    errors = _errors(runs, "world around")
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert f"{K * 2}x" in errors[0].title, errors[0].title
    assert "* 2" in errors[0].evidence, errors[0].evidence
