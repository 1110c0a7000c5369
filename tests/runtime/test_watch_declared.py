"""The K a training script declares, read statically from its source (no import, no run)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accumguard.watch._declared import declared_k, script_of_command


def _script(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


NANOGPT = """
gradient_accumulation_steps = 5 * 8
batch_size = 12
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
for micro_step in range(gradient_accumulation_steps):
    loss = loss / gradient_accumulation_steps
"""


@pytest.mark.parametrize(("world", "expected"), [(1, 40), (2, 20), (4, 10)])
def test_nanogpt_world_size_form(tmp_path: Path, world: int, expected: int) -> None:
    path = _script(tmp_path, NANOGPT)
    k = declared_k(["torchrun", "--nproc-per-node", str(world), str(path)], world=world)
    assert k is not None and k.value == expected
    assert k.divides_loss and k.line == 2 and k.where == f"{path}:2"


def test_nanogpt_configurator_override(tmp_path: Path) -> None:
    path = _script(tmp_path, NANOGPT)
    k = declared_k(["python", str(path), "--gradient_accumulation_steps=1"])
    assert k is not None and k.value == 1 and "command line" in k.how


ARGPARSE = """
import argparse
p = argparse.ArgumentParser()
p.add_argument('--grad-accum', '-g', type=int, default=4)
p.add_argument('--lr', type=float, default=1e-3)
args = p.parse_args()
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / args.grad_accum
    loss.backward()
"""


@pytest.mark.parametrize(("args", "expected"), [
    ([], 4), (["--grad-accum", "1"], 1), (["--grad-accum=8"], 8), (["-g", "2"], 2),
    (["--lr", "4"], 4),
])
def test_argparse_default_and_command_line(tmp_path: Path, args: list[str],
                                           expected: int) -> None:
    path = _script(tmp_path, ARGPARSE)
    k = declared_k(["python", "-u", str(path), *args])
    assert k is not None and k.name == "grad_accum" and k.value == expected
    assert k.divides_loss


def test_dataclass_field_alias_and_div_call(tmp_path: Path) -> None:
    path = _script(tmp_path, """
        from dataclasses import dataclass, field
        @dataclass
        class TrainConfig:
            accumulation_steps: int = field(default=8)
            lr: float = 1e-3
        cfg = TrainConfig()
        K = cfg.accumulation_steps
        out.loss.div(K).backward()
    """)
    k = declared_k(["deepspeed", "--num_gpus", "2", str(path)])
    assert k is not None and k.value == 8 and k.divides_loss


def test_environment_default_and_override(tmp_path: Path) -> None:
    path = _script(tmp_path, """
        import os
        ACCUM_STEPS = int(os.environ.get("ACCUM_STEPS", 4))
        (loss_fn(pred, target) / ACCUM_STEPS).backward()
    """)
    assert declared_k(["python", str(path)], environ={}).value == 4
    assert declared_k(["python", str(path)], environ={"ACCUM_STEPS": "1"}).value == 1


def test_bare_k_only_when_it_divides_the_loss(tmp_path: Path) -> None:
    unrelated = _script(tmp_path, "K = 4\nlogits = model(x)[:, :K]\n", "a.py")
    assert declared_k(["python", str(unrelated)]) is None
    used = _script(tmp_path, "K = 4\nloss = crit(model(x), y) / K\nloss.backward()\n", "b.py")
    k = declared_k(["python", str(used)])
    assert k is not None and k.name == "K" and k.value == 4


def test_unknown_value_and_no_declaration(tmp_path: Path) -> None:
    path = _script(tmp_path, "grad_accum = compute_accum(cfg)\nloss = l / grad_accum\n")
    k = declared_k(["python", str(path)])
    assert k is not None and k.value is None
    plain = _script(tmp_path, "opt.step()\n", "plain.py")
    assert declared_k(["python", str(plain)]) is None


def test_script_of_command_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _script(tmp_path, "x = 1\n", "pkg/train.py")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert script_of_command(["accelerate", "launch", "--num_processes", "2", str(path), "--a",
                              "1"]) == (path, ["--a", "1"])
    assert script_of_command([
        "python", "-m", "torch.distributed.run", "--nproc-per-node", "2", str(path)]) == (path, [])
    found = script_of_command(["python", "-m", "pkg.train", "--k", "2"], cwd=str(tmp_path))
    assert found == (tmp_path / "pkg" / "train.py", ["--k", "2"])
    assert script_of_command(["python", "-c", "print(1)"]) is None
    broken = _script(tmp_path, "def (:\n", "broken.py")
    assert declared_k(["python", str(broken)]) is None  # never raises on a bad script


@pytest.mark.parametrize(("name", "strong"), [
    ("gradient_accumulation_steps", True), ("grad_accum", True), ("accum_iter", True),
    ("GRAD_ACCUM_STEPS", True), ("gradient_accumulation_iters", True), ("n_accum", True),
    ("accumulate_grad_batches", True), ("grad_acc_steps", True), ("update_freq", True),
    ("acc", False), ("accuracy", False), ("acc_val", False), ("batch_size", False),
])
def test_k_like_names(tmp_path: Path, name: str, strong: bool) -> None:
    path = _script(tmp_path, f"{name} = 4\nloss = crit(out, y)\nloss.backward()\n")
    k = declared_k(["python", str(path)])
    assert (k is not None and k.value == 4) == strong


def test_nanogpt_config_file_argument(tmp_path: Path) -> None:
    path = _script(tmp_path, NANOGPT)
    cfg = _script(tmp_path, "gradient_accumulation_steps = 1\nbatch_size = 64\n", "cfg.py")
    k = declared_k(["python", str(path), str(cfg)])
    assert k is not None and k.value == 1 and "config file" in k.how


TUPLE = """
MICRO_BSZ, ACCUM_STEPS, TRAIN_STEPS = 4, 6, 10
LR, (A, B) = 1e-3, (1, 2)
for _ in range(ACCUM_STEPS):
    (loss / ACCUM_STEPS).backward()
"""


def test_tuple_assignment_binds_element_wise(tmp_path: Path) -> None:
    k = declared_k(["python", str(_script(tmp_path, TUPLE))])
    assert k is not None and k.value == 6 and k.divides_loss and k.line == 2


def test_an_object_named_like_k_does_not_rebind_it(tmp_path: Path) -> None:
    # blind round 51 c_b01: CONFIG["accum"] = 4, then `accum = GradAccumulator(opt,
    # cfg["accum"])` (the helper object) and `loss / cfg["accum"]`: K stays 4; before, the
    # object's assignment made it unknown and K was inferred from a reference phase (1)
    path = _script(tmp_path, """
        CONFIG = {"accum": 4, "epochs": 2}
        def train(cfg):
            accum = GradAccumulator(opt, cfg["accum"])
            (loss / cfg["accum"]).backward()
    """)
    k = declared_k(["python", str(path)])
    assert k is not None and k.value == 4 and k.divides_loss, k
    # a count computed by a call stays a (possibly unknown) rebinding
    path = _script(tmp_path, """
        CONFIG = {"accum": 4}
        accum = int(os.environ["ACCUM"])
        loss = loss / accum
    """, "env.py")
    k = declared_k(["python", str(path)])
    assert k is not None and k.value is None, k


def test_an_accumulation_option_that_never_reaches_the_loop_is_f1() -> None:
    """Every step after one backward (blind round 101 c_b01, recorded on 2 gloo ranks: K stays
    the config's default 1) and a script whose accumulation option its dataclass filter
    drops (lint AG187): F1 at error, the lint's words in the evidence. The same run with a
    script whose option reaches the config: nothing (K = 1 may be what was meant)."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._report import _dropped_option_findings
    from tests.helpers import RECORDED

    rec = load_recordings(RECORDED / "r101_k_one_every_step")
    findings, _, _ = analyze(rec, k_flag=None)
    corpus = Path(__file__).parents[1] / "lint_corpus"
    dropped = _dropped_option_findings(
        rec, findings, ["python", str(corpus / "bug_argparse_option_dropped_by_dataclasses_replace.py")])
    assert [(f.cls, f.severity) for f in dropped] == [("F1", "error")], dropped
    assert "never reaches `Config`" in dropped[0].evidence
    assert _dropped_option_findings(
        rec, findings, ["python", str(corpus / "ok_argparse_option_reaches_dataclasses_replace.py")]) == []
    # blind round 114 a_b01: accumulate() around an Accelerator left at K = 1 (lint AG322)
    acc = _dropped_option_findings(
        rec, findings, ["python", str(corpus / "bug_accelerate_accumulate_with_default_k.py")])
    assert [(f.cls, f.severity) for f in acc] == [("F1", "error")], acc
    assert "AG322" not in acc[0].evidence and "built without gradient_accumulation_steps" \
        in acc[0].evidence
    assert "Accelerator(gradient_accumulation_steps=K)" in acc[0].fix
    assert _dropped_option_findings(
        rec, findings, ["python", str(corpus / "ok_accelerate_accumulate_with_config_k.py")]) == []
    # blind round 119 c_b02: nanoGPT's //= world kept with a per-rank count of 2 (lint AG335)
    div = _dropped_option_findings(
        rec, findings, ["python", str(corpus / "bug_nanogpt_per_rank_k_divided_by_world.py")])
    assert [(f.cls, f.severity) for f in div] == [("F1", "error")], div
    assert "divides its accumulation count down to 1" in div[0].evidence
    assert "world size down to 1" in div[0].title
    assert _dropped_option_findings(
        rec, findings, ["python", str(corpus / "ok_nanogpt_job_k_divided_by_world.py")]) == []
    # blind round 124 c_b03: a config filtered to Lightning's Trainer signature (lint AG347)
    sig = _dropped_option_findings(
        rec, findings, ["python", str(corpus / "bug_lightning_config_filtered_to_trainer_signature.py")])
    assert [(f.cls, f.severity) for f in sig] == [("F1", "error")], sig
    assert "grad_accum_steps" in sig[0].evidence
    assert _dropped_option_findings(
        rec, findings, ["python", str(corpus / "ok_lightning_config_filtered_with_k_mapped.py")]) == []


def test_a_schedule_error_only_the_source_shows_is_kept_when_the_run_confirms_it() -> None:
    """A hand-written schedule's horizon is not in the run: lint's F4 error (here AG130, a
    rate written from Lightning's micro-batch counter) is kept in the watch report when the
    run shows what it rests on (the optimizer stepped once per K >= 2 backwards, the rate
    changed: a hand schedule recorded on K = 3), and not on a run of one backward per step,
    on the correct twin, or beside any F4 finding of the run's own (a file may hold several
    modes: tests/runtime/test_watch_lr_by_hand.py's token schedule)."""
    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import schedule_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    bug = ["python", str(corpus / "bug_lightning_callback_lr_from_total_batch_idx.py")]
    ok = ["python", str(corpus / "ok_lightning_callback_lr_from_global_step_before_step.py")]
    rec = load_recordings(RECORDED / "r108_hand_lr_per_optimizer_step")
    findings, _, _ = analyze(rec, k_flag=None)
    kept = schedule_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F4", "error")], kept
    assert "lint AG130" in kept[0].evidence and "total_batch_idx" in kept[0].evidence
    assert "once per 3 backward passes" in kept[0].evidence, kept[0].evidence
    assert "trainer.global_step" in kept[0].fix
    assert schedule_source_findings(rec, findings, ok) == []
    for level in ("error", "warning", "note"):  # the run's own word on its schedule
        own = [_mk("F4", level, None, 0, None, "measured")]
        assert schedule_source_findings(rec, own, bug) == []
    one = load_recordings(RECORDED / "r101_k_one_every_step")
    assert schedule_source_findings(one, analyze(one, k_flag=None)[0], bug) == []
    # blind round 117 c_b03: a KL controller moved every micro-step (AG330) is a loss
    # coefficient's schedule: kept on K >= 2 windows with a constant learning rate too
    for ss in rec.steps.values():
        for st in ss:
            st["lr"] = 0.001
    assert schedule_source_findings(rec, findings, bug) == []
    kl = schedule_source_findings(
        rec, findings, ["python", str(corpus / "bug_kl_controller_updated_every_micro_step.py")])
    assert [(f.cls, f.severity) for f in kl] == [("F4", "error")], kl
    assert "lint AG330" in kl[0].evidence and "learning rate" not in kl[0].evidence
    assert schedule_source_findings(
        rec, findings, ["python", str(corpus / "ok_kl_controller_updated_per_window.py")]) == []


def test_a_trainer_told_its_micro_batch_mean_is_scaled_is_kept_when_the_windows_show_k(
) -> None:
    """Blind round 121 b_b01: a hand-built focal loss (no loss call the run records), each
    micro-batch's mean, under a Trainer subclass with ``loss_is_scaled_for_ga = True``: lint's
    LOSS_SCALE error (AG174) is kept when the run's windows are K >= 2 backwards long; not on
    the window-share twin, on a run of one backward per step, or beside the run's own
    LOSS_SCALE error."""
    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import scale_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    bug = ["python", str(corpus / "bug_hf_scaled_flag_focal_sum_over_rows.py")]
    ok = ["python", str(corpus / "ok_hf_scaled_flag_focal_sum_over_num_items.py")]
    rec = load_recordings(RECORDED / "r108_hand_lr_per_optimizer_step")
    findings, _, _ = analyze(rec, k_flag=None)
    kept = scale_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("LOSS_SCALE", "error")], kept
    assert "lint AG174" in kept[0].evidence and "once per 3 backward passes" in kept[0].evidence
    assert "loss_is_scaled_for_ga" in kept[0].evidence
    assert scale_source_findings(rec, findings, ok) == []
    assert scale_source_findings(rec, [_mk("LOSS_SCALE", "error", None, 0, None, "m")], bug) == []
    one = load_recordings(RECORDED / "r101_k_one_every_step")
    assert scale_source_findings(one, analyze(one, k_flag=None)[0], bug) == []


def test_a_source_claim_that_raises_is_accumguards_failure_and_the_rest_still_reports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims read from the script run after the rules, each on its own: one that raises
    (accumguard's own bug) is named in the report as accumguard's failure, the run's own
    findings stay, and nothing raises into the caller."""
    import accumguard.watch._source_claims as claims
    from accumguard.watch import judge
    from tests.helpers import RECORDED

    def broken(*_: object) -> list[object]:
        raise RuntimeError("boom")

    corpus = Path(__file__).parents[1] / "lint_corpus"
    cmd = ["python", str(corpus / "bug_lightning_callback_lr_from_total_batch_idx.py")]
    whole = judge(RECORDED / "r110_accelerate_resume_skips_into_the_tail", command=cmd)
    assert [f.cls for f in whole.findings if f.severity.value == "error"] == ["F13", "F4"]
    monkeypatch.setattr(claims, "schedule_source_findings", broken)
    res = judge(RECORDED / "r110_accelerate_resume_skips_into_the_tail", command=cmd)
    assert [f.cls for f in res.findings if f.severity.value == "error"] == ["F13"]
    failed = res.report["accumguard_failed"]
    assert failed and any("schedule_source_findings" in line for line in failed), failed


def test_a_resume_error_only_the_source_shows_is_kept_when_the_run_resumed() -> None:
    """Blind round 112 a_b03 (nanoGPT, checkpoint saved at the top of the iteration, resumed
    at the saved iteration + 1: one window skipped, every window still K long). Lint's F13
    error (AG318) is kept in the watch report when the run loaded an optimizer's state (a
    resume: ``state_loads`` in the end record); not for the correct twin's source, not on a
    run that never loaded a state, and not beside an F13 error of the run's own."""
    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import resume_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    bug = ["python", str(corpus / "bug_resume_plus_one_after_top_of_loop_save.py")]
    ok = ["python", str(corpus / "ok_resume_plus_one_after_step_save.py")]
    rec = load_recordings(RECORDED / "r112_nanogpt_resume_after_saved_iteration")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.cls == "F13" and f.severity == "error"], findings
    kept = resume_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F13", "error")], kept
    assert "lint AG318" in kept[0].evidence and "before optimizer step 21" in kept[0].evidence
    assert "after a resume" in kept[0].title
    assert resume_source_findings(rec, findings, ok) == []
    assert resume_source_findings(rec, [_mk("F13", "error", None, 0, None, "own")], bug) == []
    # its mirror (blind round 115 b_b03): the loop restarted at the saved index of a
    # micro-batch already trained (lint AG327)
    again = ["python", str(corpus / "bug_resume_start_at_saved_index.py")]
    kept = resume_source_findings(rec, findings, again)
    assert [(f.cls, f.code if hasattr(f, "code") else None) for f in kept][:1] and \
        "lint AG327" in kept[0].evidence, kept
    assert resume_source_findings(
        rec, findings, ["python", str(corpus / "ok_resume_start_after_saved_index.py")]) == []
    never = load_recordings(RECORDED / "r108_hand_lr_per_optimizer_step")
    assert resume_source_findings(never, analyze(never, k_flag=None)[0], bug) == []


def test_an_optimizer_state_load_is_recorded(tmp_path: Path) -> None:
    """``Optimizer.load_state_dict`` under observation: the step it ran before is in the end
    record, and the load itself is the script's (the state is restored as without watch). A
    fresh optimizer reloading its own empty state is no resume and is not recorded."""
    import torch

    from accumguard.watch._findings import load_recordings
    from accumguard.watch._recording import recording

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with recording(tmp_path):
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
        saved = opt.state_dict()
        placed = torch.optim.Adam(model.parameters(), lr=0.1)
        placed.load_state_dict(placed.state_dict())  # (Accelerate's prepare(): no resume)
        fresh = torch.optim.Adam(model.parameters(), lr=0.1)
        fresh.load_state_dict(saved)
    assert fresh.state_dict()["state"][0]["step"] == saved["state"][0]["step"]
    end = load_recordings(tmp_path).end[0]
    assert end.get("state_loads") == [2], end


def test_a_clip_setting_the_trainer_never_gets_is_f9_when_the_run_shows_the_clip_acting() -> None:
    """Blind round 115 c_b03: DeepSpeed's ``"gradient_clipping": 0.0`` in an HF settings dict
    parsed with ``allow_extra_keys=True`` is dropped; the Trainer clips at 1.0. Lint can only
    warn (AG326: it changes updates whose norm exceeds 1); the recorded run (2 gloo ranks)
    shows the clip shrinking updates, so the report keeps it as an F9 error. Not for the
    twin's source, not beside an F9 error of the run's own, not on a run whose clips never
    shrank an update."""
    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import clip_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    bug = ["python", str(corpus / "bug_hf_parse_dict_drops_clip_key.py")]
    ok = ["python", str(corpus / "ok_hf_parse_dict_max_grad_norm.py")]
    rec = load_recordings(RECORDED / "r115_hf_default_clip_acting")
    findings, _, _ = analyze(rec, k_flag=None)
    kept = clip_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F9", "error")], kept
    assert "lint AG326" in kept[0].evidence and "shrank the update" in kept[0].evidence
    assert "max_grad_norm" in kept[0].fix
    assert clip_source_findings(rec, findings, ok) == []
    assert clip_source_findings(rec, [_mk("F9", "error", None, 0, None, "own")], bug) == []
    calm = load_recordings(RECORDED / "r112_nanogpt_resume_after_saved_iteration")
    assert clip_source_findings(calm, analyze(calm, k_flag=None)[0], bug) == []


def test_a_none_clip_filtered_out_before_the_trainer_is_f9_when_the_run_shows_the_clip() -> None:
    """Blind round 116 b_b02: a settings dataclass means "no clipping" by
    ``max_grad_norm = None`` and filters the None values out before
    ``TrainingArguments(**kwargs)``: the Trainer clips at 1.0. Lint warns (AG328); with the
    run showing the clip shrinking updates, the report keeps it as an F9 error. Not for the
    twin that puts 0.0 back."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import clip_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r115_hf_default_clip_acting")
    findings, _, _ = analyze(rec, k_flag=None)
    bug = ["python", str(corpus / "bug_hf_none_filter_drops_clip_off.py")]
    kept = clip_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F9", "error")], kept
    assert "lint AG328" in kept[0].evidence and "filtered out" in kept[0].evidence
    ok = ["python", str(corpus / "ok_hf_none_filter_puts_clip_off_back.py")]
    assert clip_source_findings(rec, findings, ok) == []
    # blind round 131 b_b03: clipping "off" by leaving max_grad_norm out of the arguments
    # (AG370, an error of its own at lint), kept on the same evidence of the clip acting
    left_out = ["python", str(corpus / "bug_hf_clip_off_by_leaving_max_grad_norm_out.py")]
    kept = clip_source_findings(rec, findings, left_out)
    assert [(f.cls, f.severity) for f in kept] == [("F9", "error")] and "lint AG370" in kept[0].evidence
    zero = ["python", str(corpus / "ok_hf_clip_off_as_max_grad_norm_zero.py")]
    assert clip_source_findings(rec, findings, zero) == []


def test_a_deepspeed_train_batch_without_the_world_is_f1_when_the_run_had_several_ranks() -> None:
    """Blind round 130 a_b02, recorded on 2 gloo ranks: a batch ramp calls
    ``engine.set_train_batch_size(micro * k)``; DeepSpeed's train batch is global, so each
    rank stepped after k / 2 micro-batches. Lint can only warn (AG152: right on one process);
    the run had 2, so the report keeps it as an F1 error. Not for the twin that multiplies by
    the ranks, not on one process, not beside an F1 error of the run's own."""
    import dataclasses

    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import world_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r130_ds_train_batch_ramp_without_world")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone: silent
    bug = ["python", str(corpus / "bug_ds_batch_ramp_without_world.py")]
    kept = world_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F1", "error")], kept
    assert "lint AG152" in kept[0].evidence and "the run had 2 processes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_ds_batch_ramp_with_world.py")]
    assert world_source_findings(rec, findings, ok) == []
    assert world_source_findings(dataclasses.replace(rec, world=1), findings, bug) == []
    assert world_source_findings(rec, [_mk("F1", "error", None, 0, None, "own")], bug) == []


def test_a_target_network_moved_every_micro_step_is_f4_when_the_windows_show_k() -> None:
    """Blind round 130 c_b02, recorded on 2 gloo ranks: a Fabric DQN's Polyak target update
    runs on every micro-batch, K = 4 per optimizer step, at a constant learning rate: the run
    alone said nothing. Lint's F4 error (AG158) needs only the windows the run shows, as a KL
    controller's does; not for the twin that updates at the boundary, nor on a run of one
    backward per step."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import schedule_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r130_fabric_target_update_every_micro_step")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone
    bug = ["python", str(corpus / "bug_momentum_teacher_lerp_every_micro_step.py")]
    kept = schedule_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F4", "error")], kept
    assert "lint AG158" in kept[0].evidence and "once per 4 backward passes" in kept[0].evidence
    assert "learning rate" not in kept[0].evidence
    ok = ["python", str(corpus / "ok_momentum_teacher_at_the_boundary.py")]
    assert schedule_source_findings(rec, findings, ok) == []
    one = load_recordings(RECORDED / "r101_k_one_every_step")
    assert schedule_source_findings(one, analyze(one, k_flag=None)[0], bug) == []


def test_a_clamp_in_a_tensor_hook_is_f8_when_the_windows_show_k() -> None:
    """Blind round 128 b_b01, recorded on 2 gloo ranks: a "spike guard" clamps each LoRA
    parameter's gradient in ``p.register_hook``, on every micro-batch's contribution, under
    the Trainer's K = 4; no clipping call shows it, and the run alone said nothing. Lint's F8
    error (AG138) is kept when the run's windows are K >= 2 backwards: not for the twin that
    clamps before the optimizer step, not beside an F8 error of the run's own, not on a run
    of one backward per step."""
    from accumguard.observe._records import _mk
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import hook_clip_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r128_hf_clamp_in_tensor_hook")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone
    bug = ["python", str(corpus / "bug_hf_trainer_clamp_in_param_hook.py")]
    kept = hook_clip_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F8", "error")], kept
    assert "lint AG138" in kept[0].evidence and "once per 4 backward passes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_hf_trainer_clamp_before_optimizer_step.py")]
    assert hook_clip_source_findings(rec, findings, ok) == []
    assert hook_clip_source_findings(rec, [_mk("F8", "error", None, 0, None, "own")], bug) == []
    one = load_recordings(RECORDED / "r101_k_one_every_step")
    assert hook_clip_source_findings(one, analyze(one, k_flag=None)[0], bug) == []


def test_a_rate_from_accelerators_micro_batch_counter_is_f4_when_the_rate_moved() -> None:
    """Blind round 129 b_b02, recorded on 2 gloo ranks: a hand warm-up reads
    ``accelerator.step`` (Accelerate's micro-batch counter, reset with each loader) as the
    optimizer's step, K = 4; the run alone said nothing. Lint's AG367 is kept as an F4 error:
    the windows are 4 backwards and the rate moved. Not for the twin counting its updates."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import schedule_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r129_accelerate_lr_from_accelerator_step")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone
    bug = ["python", str(corpus / "bug_accelerate_warmup_from_accelerator_step.py")]
    kept = schedule_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F4", "error")], kept
    assert "lint AG367" in kept[0].evidence and "once per 4 backward passes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_accelerate_warmup_from_own_update_count.py")]
    assert schedule_source_findings(rec, findings, ok) == []


def test_an_overrides_own_window_counter_is_f13_when_the_run_shows_a_short_window() -> None:
    """Blind round 129 b_b01, recorded on 2 gloo ranks: a Trainer subclass adds a per-update
    penalty when its own micro-batch counter is a multiple of K = 4, while the Trainer's
    epochs of 5 micro-batches run windows of 4 and 1; the run alone said nothing. Lint warns
    (AG368: it needs such an epoch); the run shows the short window, so the report keeps it as
    an F13 error. Not for the twin, not on a run whose windows are all K long."""
    import dataclasses

    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import counter_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r129_hf_own_window_counter")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone
    bug = ["python", str(corpus / "bug_hf_training_step_own_window_counter.py")]
    kept = counter_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F13", "error")], kept
    assert "lint AG368" in kept[0].evidence and "after 1 backward pass" in kept[0].evidence
    ok = ["python", str(corpus / "ok_hf_training_step_window_from_global_step.py")]
    assert counter_source_findings(rec, findings, ok) == []
    full = dataclasses.replace(rec, steps={r: [{**s, "backwards": 4} for s in ss]
                                           for r, ss in rec.steps.items()})
    assert counter_source_findings(full, findings, bug) == []


def test_a_gradient_term_added_after_every_backward_is_loss_scale_when_the_windows_show_k() -> None:
    """Blind round 131 c_b01, recorded on 2 gloo ranks: Lightning's ``on_after_backward`` adds
    an L2-SP gradient to ``.grad`` after every micro-batch, K = 4. The run sees the gradient
    grow between backward passes (a LOSS_SCALE warning: it cannot tell whether the term was
    divided by K; it said F3 at error before). Lint's AG369 reads that it was not, and the
    report keeps it as a LOSS_SCALE error on the K = 4 windows; not for the twin dividing it."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import scale_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r131_lightning_grad_term_on_after_backward")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings
    assert {f.cls for f in findings if f.severity == "warning"} == {"LOSS_SCALE"}, findings
    bug = ["python", str(corpus / "bug_lightning_weight_decay_grad_on_after_backward.py")]
    kept = scale_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("LOSS_SCALE", "error")], kept
    assert "lint AG369" in kept[0].evidence
    ok = ["python", str(corpus / "ok_lightning_weight_decay_grad_over_k.py")]
    assert scale_source_findings(rec, findings, ok) == []


def test_a_hand_built_penalty_beside_a_divided_task_loss_is_loss_scale_on_k_windows() -> None:
    """Blind round 131 a_b03, recorded on 2 gloo ranks (FSDP2): a trainer's backwarded loss
    is a helper's sum, the task loss divided by K in its own helper and an orthogonality
    penalty built by hand beside it in full, on every micro-batch. The loss record holds the
    task loss only, and the run alone said nothing. Lint's AG127 (followed into the helpers)
    is kept as a LOSS_SCALE error on the K >= 2 windows; not for the twin dividing both."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import scale_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r131_fsdp2_penalty_beside_divided_task")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings
    bug = ["python", str(corpus / "bug_trainer_helper_sum_penalty_not_over_k.py")]
    kept = scale_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("LOSS_SCALE", "error")], kept
    assert "lint AG127" in kept[0].evidence
    ok = ["python", str(corpus / "ok_trainer_helper_sum_both_over_k.py")]
    assert scale_source_findings(rec, findings, ok) == []


def test_a_client_scheduler_period_in_micro_batches_is_f4_when_the_run_confirms() -> None:
    """Blind round 132 a_b01, recorded on 2 gloo ranks: a ZeRO-1 trainer hands DeepSpeed a
    `StepLR(step_size=len(loader))` meant to decay once per epoch; the engine steps it once per
    optimizer step (GA = 3), so it decays once per 3 epochs. The run alone said nothing: its
    rates are a schedule's. Lint's AG124 (the client scheduler's shape) is kept as F4 when the
    run shows the K >= 2 windows and the rate moving; not for the twin sized in updates."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import schedule_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r132_ds_client_steplr_period_micro_batches")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone: silent
    bug = ["python", str(corpus / "bug_deepspeed_client_steplr_period_in_micro_batches.py")]
    kept = schedule_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F4", "error")], kept
    assert "lint AG124" in kept[0].evidence and "once per 3 backward passes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_deepspeed_client_schedulers_in_optimizer_steps.py")]
    assert schedule_source_findings(rec, findings, ok) == []


def test_a_trainer_loss_skipping_the_pad_id_it_counts_is_loss_scale_on_windows() -> None:
    """Blind round 133 b_b01, recorded on 2 gloo ranks: a `compute_loss_func` sums the token
    loss with `ignore_index=PAD_ID` and divides by `num_items_in_batch`, which the Trainer
    counts over the labels that are not -100, padding included (the collator clones the
    padded ids into the labels). The run alone said nothing; lint's AG379 is kept as
    LOSS_SCALE on the K >= 2 windows the run shows; not for the twin that labels padding -100."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import scale_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r133_hf_loss_func_skips_pad_id_in_item_count")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone: silent
    bug = ["python", str(corpus / "bug_hf_compute_loss_ignores_pad_id_over_item_count.py")]
    kept = scale_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("LOSS_SCALE", "error")], kept
    assert "lint AG379" in kept[0].evidence and "backward passes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_hf_loss_func_maps_ignored_to_pad_id.py")]
    assert scale_source_findings(rec, findings, ok) == []


def test_a_lightning_lambda_reading_the_batch_counter_is_f4_when_the_run_confirms() -> None:
    """Blind round 135 c_b02, recorded on 2 gloo ranks: a Lightning `LambdaLR` whose function
    ignores its step and reads `trainer.fit_loop.total_batch_idx` (micro-batches) under
    `accumulate_grad_batches=3`: the warm-up and decay run 3 times fast. The run alone sees a
    schedule that moves; lint's AG130 is kept as F4 on the K >= 2 windows with the rate
    moving; not for the twin whose lambda reads its step."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings
    from accumguard.watch._source_claims import schedule_source_findings
    from tests.helpers import RECORDED

    corpus = Path(__file__).parents[1] / "lint_corpus"
    rec = load_recordings(RECORDED / "r135_lightning_lambda_reads_batch_counter")
    findings, _, _ = analyze(rec, k_flag=None)
    assert not [f for f in findings if f.severity == "error"], findings  # the run alone: silent
    bug = ["python", str(corpus / "bug_lightning_lambda_reads_batch_counter.py")]
    kept = schedule_source_findings(rec, findings, bug)
    assert [(f.cls, f.severity) for f in kept] == [("F4", "error")], kept
    assert "lint AG130" in kept[0].evidence and "once per 3 backward passes" in kept[0].evidence
    ok = ["python", str(corpus / "ok_lightning_lambda_reads_its_step.py")]
    assert schedule_source_findings(rec, findings, ok) == []
