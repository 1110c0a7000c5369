"""The loss-weight ledger under the real ``accumguard watch`` CLI on 2 gloo ranks (issue 25):
a loss normalised to the window's global token count and then averaged again by DDP, FSDP2
or DeepSpeed ZeRO-2 (F10, W x too small), a loss divided by the world size on top of the
engine's average (F10), each rank normalising by its own count (F6, an error), and the
correct twins: the global count times W, the per-rank mean / K, a constant weight of 0.5
the user chose on two ranks (a note, not judged).

Every case runs in ONE torchrun launch (tests/watch_sweep.py), each recorded as ``watch``
records it and judged by the function the CLI calls; tests/runtime/test_watch.py launches
the real CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

from helpers import free_port

SCRIPT = Path(__file__).parent.parent / "watch_scripts" / "ledger_loops.py"


def _cmd(engine: str, mode: str, opt: str = "sgd", k: int = 3) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
            engine, mode, opt, str(k)]


CASES = [
    ("ddp", "global_noW", "sgd", {"F10"}),
    ("ddp", "global", "sgd", set()),
    ("ddp", "equal_div_w", "adamw", {"F10"}),
    ("ddp", "coef", "sgd", set()),
    ("fsdp2", "global_noW", "sgd", {"F10"}),
    ("fsdp2", "global", "sgd", set()),
    ("ds", "equal_div_w", "sgd", {"F10"}),
    ("ds", "equal", "sgd", set()),
    ("ddp", "global_aux", "adamw", {"F10"}),
    ("ddp", "global_aux_w", "adamw", set()),
    ("fsdp2u", "sum_root", "sgd", {"F10"}),
    ("fsdp2u", "sum_all", "sgd", set()),
]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    cases = {f"{e}-{m}-{o}-3": _cmd(e, m, o) for e, m, o, _ in CASES}
    cases.update({"ddp-local-sgd-3": _cmd("ddp", "local"),
                  "ddp-equal_div_w-sgd-1": _cmd("ddp", "equal_div_w", "sgd", 1),
                  "ddp-global_share-sgd-2": _cmd("ddp", "global_share", "sgd", 2),
                  "ddp-pg_ent_own-adamw-3": _cmd("ddp", "pg_ent_own", "adamw"),
                  "ddp-pg_ent_window-adamw-3": _cmd("ddp", "pg_ent_window", "adamw")})
    return watch_many(tmp_path_factory.mktemp("ledger"), cases)


@pytest.mark.parametrize(("engine", "mode", "opt", "expected"), CASES)
def test_ledger_under_watch(watched: dict[str, Watched], engine: str, mode: str, opt: str,
                            expected: set[str]) -> None:
    code, findings, report, proc = watched[f"{engine}-{mode}-{opt}-3"]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert report["ranks"] == [0, 1]
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)
    if expected:
        f = next(f for f in findings if f["cls"] == "F10")
        if mode == "sum_root":  # the Linear unit still averages: half the large batch's
            assert "different factors" in f["evidence"] and "`2`" in f["evidence"], f
            assert "1/2x" in f["title"] and "(root)" in f["evidence"], f
            return
        assert "2x too small" in f["evidence"] and "ledger_loops.py:" in f["evidence"], f
        if mode == "global_aux":
            assert "one term of a sum" in f["evidence"], f
        elif mode == "global_noW":
            assert "global count" in f["evidence"], f
        else:
            assert "divided by 2" in f["evidence"], f
        if opt == "adamw" and mode != "global_aux":
            assert "epsilon" in f["evidence"], f
    if mode == "coef":  # 0.5 on two ranks: said, not judged
        assert any(f["cls"] == "LOSS_SCALE" and "not judged" in f["evidence"]
                   for f in findings), findings


def test_rank_local_normalisation_is_an_error(watched: dict[str, Watched]) -> None:
    """DDP, each rank divides its summed loss by its own window count: F6 error, exit 1."""
    code, findings, _, proc = watched["ddp-local-sgd-3"]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert code == 1 and _errors(findings) == {"F6"}, findings
    f6 = [f for f in findings if f["cls"] == "F6"]
    assert f6 and f6[0]["severity"] == "error" and "/N for each of" in f6[0]["evidence"], f6


def test_no_accumulation_loss_divided_by_world_size(watched: dict[str, Watched]) -> None:
    """K = 1 (one backward per step): DDP and loss / world_size is still F10 (the loss
    record keeps windows of one micro-step when several ranks run)."""
    code, findings, _, proc = watched["ddp-equal_div_w-sgd-1"]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert code == 1 and _errors(findings) == {"F10"}, findings


def test_a_rank_whose_share_of_a_right_total_is_one_over_k(watched: dict[str, Watched]) -> None:
    """DDP, K = 2 = W, the summed loss times W over the window's global count, with 12 and
    4 tokens per micro-step on the ranks: rank 1's own tokens weigh 1/K in total, the
    update's weigh 1 over both ranks (blind round 67 b_c02: a rank-local LOSS_SCALE "divided
    by K twice" error on a correct FSDP2 loop)."""
    code, findings, _, proc = watched["ddp-global_share-sgd-2"]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert code == 0 and _errors(findings) == set(), findings


@pytest.mark.parametrize(("mode", "expected"), [("pg_ent_own", {"LOSS_SCALE"}),
                                                ("pg_ent_window", set())])
def test_a_bonus_term_over_its_own_micro_batch_beside_a_window_normalised_objective(
        watched: dict[str, Watched], mode: str, expected: set[str]) -> None:
    """A policy-gradient masked sum normalised over the window's all-reduced count x W, and
    an entropy bonus that is a masked mean over each micro-batch's own tokens (blind round 80
    c_b02): the bonus weighs K x its coefficient, an error naming the masked mean; normalised
    like the objective, nothing."""
    code, findings, report, proc = watched[f"ddp-{mode}-adamw-3"]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert _errors(findings) == expected, findings
    if expected:
        f = next(f for f in findings if f["cls"] == "LOSS_SCALE")
        assert "3x its coefficient" in f["title"] and "masked mean" in f["evidence"], f
