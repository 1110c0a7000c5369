"""The loss-weight ledger (:mod:`accumguard.observe._ledger`) on recorded windows: the loss
weights of every rank composed with the engine's reduction, judged against the large batch
(F10 error, F6 error, a note for a constant the user chose), with correct twins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accumguard.observe._ledger import ledger_findings
from accumguard.observe._ledger_source import world_divisions
from accumguard.observe._reduction import rank_factor
from accumguard.observe._term_ledger import term_findings
from accumguard.observe.rules import RunRecording, analyze

W = 2
K = 3
# per rank, per step: the valid tokens of each micro-step (uneven across ranks and steps)
UNEVEN = {0: [[8, 9, 5], [6, 10, 7], [7, 6, 9]], 1: [[9, 13, 4], [9, 10, 12], [11, 6, 8]]}
EQUAL = {0: [[18, 18, 18]] * 3, 1: [[18, 18, 18]] * 3}


def _rec(weight: Any, counts: dict[int, list[list[int]]], *, site: str = "train.py:10",
         engine: str = "ddp", factor: float | None = 1 / W, scale: float | None = 1.0,
         optimizer: str = "SGD", reduction: str = "sum", divs: list[Any] | None = None,
         engine_backward: bool = True) -> RunRecording:
    """A run whose token weight is ``weight(rank, step, micro, counts)``; on DeepSpeed each
    backward through ``engine.backward`` (it asks the engine its boundary) unless
    ``engine_backward`` is False (torch's ``loss.backward()`` on the engine's loss)."""
    rec = RunRecording(world=W)
    rec.steps = {}
    for r in range(W):
        steps = []
        for st, ns in enumerate(counts[r]):
            cons = None if scale is None else {"ok": True, "received": 0.0, "scale": scale,
                                               "params": 3, "wiped": 0.0, "stale": 0.0,
                                               "reason": ""}
            steps.append({
                "step": st, "backwards": len(ns), "applied": True, "engine": engine,
                "source": "deepspeed" if engine == "deepspeed" else "torch",
                "optimizer": optimizer, "rank_factor": factor, "conservation": cons,
                "ds_boundaries": ([m == len(ns) - 1 if engine_backward else None
                                   for m in range(len(ns))] if engine == "deepspeed" else []),
                "losses": [[site, 0, m, n, weight(r, st, m, counts), False, reduction, True,
                            False, divs or []] for m, n in enumerate(ns)]})
        rec.steps[r] = steps
    return rec


def _global(st: int, counts: dict[int, list[list[int]]]) -> int:
    return sum(sum(counts[r][st]) for r in counts)


def _classes(findings: list[Any]) -> set[tuple[str, str]]:
    return {(f.cls, f.severity) for f in findings}


def test_global_count_then_engine_average_is_f10() -> None:
    """sum / (window's all-reduced count), then DDP/FSDP2/DeepSpeed average: 1/W. The ranks'
    counts differ and every token weighs the same, so the divisor is the global count: the
    proof needs no source. Times W (or no engine average) is the large batch: silent."""
    for engine in ("ddp", "fsdp2", "deepspeed"):
        bug = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, engine=engine,
                   scale=None if engine == "deepspeed" else 1.0)
        found = ledger_findings(bug, K)
        assert _classes(found) == {("F10", "error")}, found
        f = found[0]
        assert "2x too small" in f.evidence and "global count" in f.evidence, f.evidence
        assert "held 22, 26 tokens" in f.evidence, f.evidence
        twin = _rec(lambda r, st, m, c: W / _global(st, c), UNEVEN, engine=engine,
                    scale=None if engine == "deepspeed" else 1.0)
        assert not ledger_findings(twin, K)
    # torch's loss.backward() on a DeepSpeed model: DeepSpeed's ÷GA is in its output hooks,
    # not in the weights: the total is unknown, nothing is said
    torch_bw = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, engine="deepspeed",
                    scale=None, engine_backward=False)
    assert not ledger_findings(torch_bw, K)
    # a hand-written all_reduce(SUM) after DDP's average (conservation scale W) restores it
    fixed = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, scale=float(W))
    assert not ledger_findings(fixed, K)
    # FSDP2 with set_gradient_divide_factor(1.0) and a SUM reduction: factor 1, silent
    summed = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, engine="fsdp2", factor=1.0)
    assert not ledger_findings(summed, K)


def test_unknown_reduction_or_unchecked_window_is_not_judged() -> None:
    """A DDP communication hook (factor None) or a torch window whose conservation was not
    checked (a hand-written all-reduce cannot be excluded): no F10."""
    bug = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, factor=None)
    assert not ledger_findings(bug, K)
    bug = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, scale=None)
    assert not ledger_findings(bug, K)


def test_division_by_world_size_needs_the_source(tmp_path: Path) -> None:
    """Equal counts, a mean / K / W on each rank: the same weights as a user's 0.5 * mean / K
    on two ranks. F10 only where the run divided every loss by exactly W (the constants
    between the loss call and the backward's root) and the loss call's file divides a loss
    by the world size; otherwise a note that says it was not judged."""
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\nworld = dist.get_world_size()\n"
                      "loss = ce(out, y) / K / world\nloss.backward()\n")
    coef = tmp_path / "coef.py"
    coef.write_text("loss = 0.5 * ce(out, y) / K\nloss.backward()\n")
    assert world_divisions(str(script)) == ((3, "/"),) and world_divisions(str(coef)) == ()

    def weight(r: int, st: int, m: int, c: Any) -> float:
        return 1 / 18 / K / W

    by_w = [["/", float(W)], ["/", float(K)]]
    found = ledger_findings(_rec(weight, EQUAL, site=f"{script}:3", reduction="mean",
                                 divs=by_w), K)
    assert _classes(found) == {("F10", "error")}, found
    assert "train.py:3" in found[0].evidence and "divided by 2" in found[0].evidence
    for opt, words in (("SGD", "lr/2"), ("AdamW", "epsilon")):
        f = ledger_findings(_rec(weight, EQUAL, site=f"{script}:3", optimizer=opt,
                                 divs=by_w), K)[0]
        assert words in f.evidence, f.evidence
    # 0.5 * loss / K: no division by W at run time, whatever else the file says
    halved = [["*", 0.5], ["/", float(K)]]
    for site in (f"{coef}:1", f"{script}:3"):
        found = ledger_findings(_rec(weight, EQUAL, site=site, reduction="mean",
                                     divs=halved), K)
        assert _classes(found) == {("LOSS_SCALE", "note")}, found
        assert "not judged" in found[0].evidence
    # divided by 2 at run time, but the file names no world size: a literal constant
    found = ledger_findings(_rec(weight, EQUAL, site=f"{coef}:1", divs=by_w), K)
    assert _classes(found) == {("LOSS_SCALE", "note")}, found
    # one division by K * W (``loss / (K * world)``, blind round 18's b07): its K part is
    # the window's mean, the W part the error; a division by K * W with a file that names
    # no world size, or by another product, stays a note
    kw = tmp_path / "kw.py"
    kw.write_text("import torch.distributed as dist\nworld = dist.get_world_size()\n"
                  "loss = mse(out, y) / (K * world)\nloss.backward()\n")
    by_kw = [["/", float(K * W)]]
    found = ledger_findings(_rec(weight, EQUAL, site=f"{kw}:3", reduction="mean",
                                 divs=by_kw), K)
    assert _classes(found) == {("F10", "error")}, found
    assert f"divided by {K * W} (K x W = {K} x {W})" in found[0].evidence, found[0].evidence
    for site, divs in ((f"{coef}:1", by_kw), (f"{kw}:3", [["/", float(K * W + 1)]])):
        found = ledger_findings(_rec(weight, EQUAL, site=site, reduction="mean", divs=divs), K)
        assert _classes(found) <= {("LOSS_SCALE", "note")}, found


def test_summed_loss_divided_by_a_named_global_count_is_f10(tmp_path: Path) -> None:
    """A summed loss divided by ``global_batch = micro * K * world`` (the large batch's N, the
    ranks' counts equal): DDP averages again, 1/W. The run divided every loss by the step's
    token count over all ranks and the file divides a loss by a name bound to a product
    with the world size: F10, and no rank's LOSS_SCALE note guessing "K twice" beside it.
    The same divisor with no world size in the product (a user's ``micro * K * 2``), or a
    divisor other than the count, stays a note."""
    n = 18 * K * W  # EQUAL: 18 tokens per micro-step
    named = tmp_path / "named.py"
    named.write_text("import torch.distributed as dist\nworld = dist.get_world_size()\n"
                     "global_batch = cfg.micro * cfg.accum * world\n"
                     "loss = ce(out, y, reduction='sum') / global_batch\nloss.backward()\n")
    literal = tmp_path / "literal.py"
    literal.write_text("global_batch = cfg.micro * cfg.accum * 2\n"
                       "loss = ce(out, y, reduction='sum') / global_batch\nloss.backward()\n")
    assert world_divisions(str(named)) == ((4, "/"),) and world_divisions(str(literal)) == ()

    def weight(r: int, st: int, m: int, c: Any) -> float:
        return 1 / n

    found = ledger_findings(_rec(weight, EQUAL, site=f"{named}:4", divs=[["/", float(n)]]), K)
    assert _classes(found) == {("F10", "error")}, found
    assert "token count over all ranks" in found[0].evidence, found[0].evidence
    assert "world size as a factor there (named.py:4)" in found[0].evidence, found[0].evidence
    for site, divs in ((f"{literal}:2", [["/", float(n)]]),
                       (f"{named}:4", [["/", float(n / 3)], ["/", 3.0]])):
        found = ledger_findings(_rec(weight, EQUAL, site=site, divs=divs), K)
        assert _classes(found) <= {("LOSS_SCALE", "note")}, found
    # the whole judge: the ledger's F10 and no LOSS_SCALE note contradicting it
    rec = _rec(weight, EQUAL, site=f"{named}:4", divs=[["/", float(n)]])
    said = _classes(analyze(rec, k_flag=K)[0])
    assert ("F10", "error") in said and not any(c == "LOSS_SCALE" for c, _ in said), said


def test_rank_local_normalisation_is_an_f6_error() -> None:
    """sum / this rank's window count, then DDP's average: each rank one weight, different
    between ranks: F6 error with the spread; the whole analysis agrees."""
    def local(r: int, st: int, m: int, c: Any) -> float:
        return 1 / sum(c[r][st])

    rec = _rec(local, UNEVEN)
    found = ledger_findings(rec, K)
    assert _classes(found) == {("F6", "error")}, found
    assert "rank 0: 1.091/N for each of 22 tokens" in found[0].evidence, found[0].evidence
    assert ("F6", "error") in _classes(analyze(rec)[0])
    # equal counts: the same weights everywhere, the large batch: silent
    assert not ledger_findings(_rec(local, EQUAL), K)


def test_each_rank_over_a_count_of_its_own_near_its_tokens_is_f6() -> None:
    """The HF Trainer with average_tokens_across_devices=False (blind round 76 a_b01, missed
    before): each rank divides by its own num_items_in_batch, which counts labels before the
    shift (a few more than the loss call's valid tokens), so the ranks' totals are near, not
    at, equal: still one weight per rank, the weights 1.5x apart. Totals further apart than
    the weights, or weights apart by less than 20 %, are not this pattern."""
    def own(extra: int) -> Any:
        return lambda r, st, m, c: 1 / (sum(c[r][st]) + extra * len(c[r][st]))

    counts = {0: [[31, 31], [28, 9]], 1: [[25, 15], [21, 32]]}
    found = ledger_findings(_rec(own(2), counts), K)
    assert _classes(found) == {("F6", "error")}, found
    assert "rank 0: 1/132 for each of 62 tokens" in found[0].evidence, found[0].evidence
    assert "a count of its own" in found[0].evidence
    # the same counts over the window's global count: one weight everywhere, silent
    assert "F6" not in {f.cls for f in ledger_findings(
        _rec(lambda r, st, m, c: W / (_global(st, c) + 8), counts), K)}
    # ranks' weights 8 % apart, totals near, not at, equal: not judged as F6
    near = {0: [[31, 31]], 1: [[28, 29]]}
    assert "F6" not in {f.cls for f in ledger_findings(_rec(own(2), near), K)}
    # one weight per rank whose totals are 2x apart: a weighting, not a count of its own
    apart = {0: [[10, 10]], 1: [[20, 20]]}
    assert "F6" not in {f.cls for f in ledger_findings(
        _rec(lambda r, st, m, c: 0.01 * (r + 1) / 2, apart), K)}


def _per_row(rec: RunRecording, d: int) -> RunRecording:
    """The same run, its loss calls counting elements, d of them per row of the input."""
    for steps in rec.steps.values():
        for st in steps:
            st["losses"] = [[*r, "elements", int(r[3]) // d] for r in st["losses"]]
    return rec


def test_a_summed_element_loss_over_the_global_row_count_is_not_f10() -> None:
    """``smooth_l1_loss(out, y, reduction="sum") * W / n_glob_samples`` under FSDP2 (blind
    round 77 b_c02, a false F10 before): each sample's d = 2 outputs summed, over the
    window's samples on all ranks; over elements the total is d = 2, which equals W: a
    per-sample sum, not a world size counted twice. Over the elements' global count without
    x W (a total of 1/W over elements, 3/W over rows of d = 3: neither is 1) it stays F10."""
    rows = {0: [[7, 4, 5], [6, 3, 8], [4, 4, 9]], 1: [[9, 13, 4], [9, 10, 12], [11, 6, 8]]}

    def counts(d: int) -> dict[int, list[list[int]]]:
        return {r: [[n * d for n in ns] for ns in st] for r, st in rows.items()}

    def per_sample(d: int) -> Any:
        return lambda r, st, m, c: W / (sum(sum(x) for x in (c[q][st] for q in c)) / d)

    two = counts(2)
    assert ledger_findings(_per_row(_rec(per_sample(2), two), 2), K) == []
    found = ledger_findings(_per_row(_rec(lambda r, st, m, c: 1 / _global(st, c), counts(3)), 3), K)
    assert [(f.cls, f.severity) for f in found] == [("F10", "error")], found


def test_other_constants_are_said_once_not_judged() -> None:
    """A total of 0.3 (a loss weight the user chose): one note; 1/K is LOSS_SCALE's."""
    found = ledger_findings(_rec(lambda r, st, m, c: 0.3 * W / _global(st, c), UNEVEN), K)
    assert [(f.cls, f.severity) for f in found] == [("LOSS_SCALE", "note")], found
    assert "0.3" in found[0].evidence and "not judged" in found[0].evidence
    assert not ledger_findings(_rec(lambda r, st, m, c: W / K / _global(st, c), UNEVEN), K)


def test_rank_factor_reads_the_engine() -> None:
    """Nothing but an engine's own state gives a factor."""
    assert rank_factor("local", [], {}, None) is None

    class Group:
        def __init__(self, factor: float | None) -> None:
            self.gradient_divide_factor = factor

            class Mesh:
                def size(self) -> int:
                    return 4

            self.mesh_info = type("MeshInfo", (), {"mesh": Mesh()})()

    assert rank_factor("fsdp2", [], {1: [Group(None)]}, None) == 0.25
    assert rank_factor("fsdp2", [], {1: [Group(1.0)]}, None) == 1.0
    assert rank_factor("fsdp2", [], {1: [Group(1.0)], 2: [Group(None)]}, None) is None
    assert rank_factor("deepspeed", [], {}, type("E", (), {"dp_world_size": 2})()) == 0.5


def test_the_loss_record_keeps_the_chain_constants(tmp_path: Path) -> None:
    """The record of a loss call keeps the divisions and multiplications between it and the
    backward's root (``["/", c]``, ``["*", c]``): ``loss / 3 / 2`` and ``0.5 * loss / 3``
    record differently although their weights are equal."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from accumguard.watch._findings import load_recordings
    from accumguard.watch._recording import recording

    def run(path: Path, scale: Any) -> list[Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with recording(path):
            for _ in range(2):
                for _ in range(3):
                    x, y = torch.randn(6, 4), torch.randint(0, 5, (6,))
                    scale(F.cross_entropy(model(x), y)).backward()
                opt.step()
                opt.zero_grad()
        steps = load_recordings(path).steps[0]
        return [r[9] for r in steps[0]["losses"]]

    divided = run(tmp_path / "a", lambda loss: loss / 3 / 2)
    halved = run(tmp_path / "b", lambda loss: 0.5 * loss / 3)
    assert divided == [[["/", 2.0], ["/", 3.0]]] * 3, divided
    assert halved == [[["/", 3.0], ["*", 0.5]]] * 3, halved


def _with_term(rec: RunRecording, divs: list[Any]) -> RunRecording:
    """Make every recorded call one term of a sum (not sole), with these chain constants."""
    for steps in rec.steps.values():
        for s in steps:
            s["losses"] = [[*x[:7], False, False, divs] for x in s["losses"]]
    return rec


def test_a_term_normalised_by_the_global_count_and_averaged_again() -> None:
    """CE / (global count) + an auxiliary term, then DDP's average: the CE term weighs 1/W
    (F10 naming its line); times W, or any coefficient on the term: silent. The whole-loss
    ledger does not judge a sum."""
    def glob(r: int, st: int, m: int, c: Any) -> float:
        return 1 / _global(st, c)

    bug = _with_term(_rec(glob, UNEVEN, site="train.py:42"), [["/", 48.0]])
    assert not ledger_findings(bug, K)
    found = term_findings(bug)
    assert _classes(found) == {("F10", "error")}, found
    assert "train.py:42" in found[0].evidence and "one term of a sum" in found[0].evidence
    assert ("F10", "error") in _classes(analyze(bug)[0])
    twin = _with_term(_rec(lambda r, st, m, c: W / _global(st, c), UNEVEN), [["*", 2.0]])
    assert not term_findings(twin)
    # 0.5 * CE / N on two ranks: a coefficient the user chose, whatever its total
    coef = _with_term(_rec(lambda r, st, m, c: 0.5 * W / _global(st, c), UNEVEN),
                      [["*", 0.5]])
    assert not term_findings(coef)
    # each rank by its own count: not one weight across ranks, not this rule's
    local = _with_term(_rec(lambda r, st, m, c: 1 / sum(c[r][st]), UNEVEN), [])
    assert not term_findings(local)
    # equal counts: a common divisor is not proven
    assert not term_findings(_with_term(_rec(lambda r, st, m, c: 1 / 108, EQUAL), []))


def test_each_micro_step_over_its_own_count_across_ranks_is_f5() -> None:
    """sum x W / (this micro-step's count all-reduced over the ranks) / K under DDP's average
    (blind round 64 b_b01): within a micro-step one weight on every rank, each micro-step's
    tokens weighing 1/K in all, the micro-steps' counts uneven: a mean of per-micro-step
    means, F5 error; the window's count over the ranks (the large batch) is silent."""
    def per_micro(r: int, st: int, m: int, c: Any) -> float:
        return W / (sum(c[q][st][m] for q in c) * K)

    found = ledger_findings(_rec(per_micro, UNEVEN), K)
    assert _classes(found) == {("F5", "error")}, found
    assert "17, 22, 9 tokens over the 2 ranks" in found[0].evidence, found[0].evidence
    assert ("F5", "error") in _classes(analyze(_rec(per_micro, UNEVEN))[0])
    # equal counts in every micro-step: one weight for all, the large batch's
    assert not ledger_findings(_rec(per_micro, EQUAL), K)
    # the window's count over the ranks
    assert not ledger_findings(_rec(lambda r, st, m, c: W / _global(st, c), UNEVEN), K)


def test_ranks_that_never_synchronise_are_named() -> None:
    """Two ranks whose received gradients differ (checksums) with no engine and no gradient
    collective of the script (Accelerate on CPU without `cpu=True` runs its processes with
    DistributedType.NO; blind round 66 a_b03): F10 (the averaging over ranks is missing, the
    mission's class; no sync flag is involved) says the ranks never synchronise, with a fix
    that says how; the same checksums under DDP keep the sync-flag wording (F11)."""
    from accumguard.observe._rank_rules import cross_rank_findings

    def rec_with(engine: str) -> RunRecording:
        rec = _rec(lambda r, st, m, c: 1 / _global(st, c), UNEVEN, engine=engine)
        for r, steps in rec.steps.items():
            for s in steps:
                s["checksum"] = [1.0 + r, 2.0 - r, 10.0]
        return rec

    (local,) = cross_rank_findings(rec_with("local"))
    assert local.cls == "F10" and "never synchronise" in local.title, local
    assert "Accelerator(cpu=True)" in local.fix
    (ddp,) = cross_rank_findings(rec_with("ddp"))
    assert ddp.cls == "F11" and "never synchronise" not in (ddp.title or ""), ddp
    # (what was measured, not a cause: a sync flag is one of the fix's candidates)
    assert "received different gradients" in ddp.title and "sync flag" in ddp.fix, ddp


def test_a_term_with_a_coefficient_over_the_global_count_is_judged_without_it() -> None:
    """Blind round 108 b_b02 (recorded, HF Trainer on 2 ranks): ``loss = lm_loss + 0.5 *
    tag_sum / num_items_in_batch`` where ``super().compute_loss`` already multiplied the LM
    term by W: the tagging term's tokens weigh 0.5 / W. The coefficient 0.5 is divided out
    (the user's), the 1/W left is F10 naming it; the twin multiplies the term by W too."""
    from tests.helpers import judge_recorded

    bad = [f for f in judge_recorded("r108_hf_tag_term_with_coefficient_over_global_count")
           if f.severity == "error"]
    assert [f.cls for f in bad] == ["F10"], bad
    assert "coefficient 0.5" in bad[0].evidence and "2x too small" in bad[0].evidence
    ok = judge_recorded("r108_hf_tag_term_times_world")
    assert [f for f in ok if f.severity == "error"] == [], ok
