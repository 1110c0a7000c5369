"""When the boundary decision takes effect: DDP's sync flag (read at the forward), the
boundary counter's first window (F13), and which GA a DeepSpeed config resolves to
(F2 vs F14). Each case is a class of code shapes, not one script."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from accumguard.static import Severity
from accumguard.static.lint import lint_file, lint_source


def found(src: str) -> list[tuple[str, int, str]]:
    return [(f.code, f.line or 0, f.severity.value) for f in lint_source(textwrap.dedent(src))]


# ---------------------------------------------------------------- DDP sync after the forward

_FLAG_AFTER_FORWARD = """
model = DDP(net)
for micro in range(K):
    out = model(batch[micro])
    model.require_backward_grad_sync = {value}
    (out.sum() / K).backward()
optimizer.step()
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # on exactly at the last micro-step, one forward late: the last one never syncs
        ("micro == K - 1", [("AG106", 5, "error")]),
        ("(micro + 1) % K == 0", [("AG106", 5, "error")]),
        # off exactly at the last micro-step, one forward late: the last one syncs (waste)
        ("micro != K - 1", [("AG116", 5, "note")]),
        ("micro < K - 1", [("AG116", 5, "note")]),
        # cannot be read: a warning, not an error
        ("schedule[micro]", [("AG106", 5, "warning")]),
        ("True", []),
    ],
)
def test_ddp_flag_after_the_forward_acts_one_micro_step_late(value: str, expected: list) -> None:
    assert found(_FLAG_AFTER_FORWARD.format(value=value)) == expected


@pytest.mark.parametrize("k", ["K", "n", "steps_per_update"])
def test_the_last_pass_of_the_window_range_is_the_boundary_whatever_its_names(k: str) -> None:
    # ``k == n - 1`` inside ``for k in range(n)``: no name says "accumulation", the loop does
    src = f"""
    model = DDP(net)
    for j in range({k}):
        out = model(batch[j])
        model.require_backward_grad_sync = j == {k} - 1
        (out.sum() / {k}).backward()
    optimizer.step()
    """
    assert found(src) == [("AG106", 5, "error")]
    assert found(src.replace("j == ", "j + 1 == ").replace(f"{k} - 1\n", f"{k}\n")) == [("AG106", 5, "error")]


def test_ddp_flag_before_the_forward_is_judged_by_polarity_only() -> None:
    src = """
    model = DDP(net)
    for micro in range(K):
        model.require_backward_grad_sync = {value}
        (model(batch[micro]).sum() / K).backward()
    optimizer.step()
    """
    assert found(src.format(value="micro == K - 1")) == []
    assert found(src.format(value="micro != K - 1")) == [("AG111", 4, "error")]


def test_flag_pair_after_the_forward_is_one_finding() -> None:
    src = """
    model = DDP(net)
    for i, b in enumerate(loader):
        loss = model(b).sum() / K
        if (i + 1) % K == 0:
            model.require_backward_grad_sync = True
        else:
            model.require_backward_grad_sync = False
        loss.backward()
        if (i + 1) % K == 0:
            opt.step(); opt.zero_grad()
    """
    assert found(src) == [("AG106", 6, "error")]


def test_boundary_helper_function_gives_the_polarity() -> None:
    src = """
    def is_update_step(i):
        return (i + 1) % K == 0
    model = DDP(net)
    for i, b in enumerate(loader):
        model.require_backward_grad_sync = {neg}is_update_step(i)
        (model(b).sum() / K).backward()
        if is_update_step(i):
            opt.step(); opt.zero_grad()
    """
    assert found(src.format(neg="")) == []
    assert found(src.format(neg="not ")) == [("AG111", 6, "error")]


@pytest.mark.parametrize(
    ("wrapper", "expected"),
    [
        ("DDP(net)", [("AG116", 6, "note")]),
        ("torch.nn.parallel.DistributedDataParallel(net)", [("AG116", 6, "note")]),
        ("FSDP(net)", []),  # FSDP1 reads no_sync in the post-backward hook: it works
        ("build(net)", [("AG116", 6, "note")]),  # unknown wrapper: the note says "if DDP"
    ],
)
def test_no_sync_around_the_backward_only_is_a_note(wrapper: str, expected: list) -> None:
    src = f"""
    model = {wrapper}
    for i, b in enumerate(loader):
        loss = model(b).sum() / K
        if (i + 1) % K:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
            opt.step(); opt.zero_grad()
    """
    got = found(src)
    assert got == expected
    if got:
        msg = lint_source(textwrap.dedent(src))[0].message
        assert ("if it is a DDP module" in msg) == wrapper.startswith("build")


def test_no_sync_around_forward_and_backward_is_silent() -> None:
    assert found("""
    model = DDP(net)
    for i, b in enumerate(loader):
        if (i + 1) % K:
            with model.no_sync():
                (model(b).sum() / K).backward()
        else:
            (model(b).sum() / K).backward()
            opt.step(); opt.zero_grad()
    """) == []


# ---------------------------------------------------------------- F13: the first window's size

_STEP_AFTER = "    (model(b) / K).backward()\n    if {guard}:\n        optimizer.step(); optimizer.zero_grad()\n"
_STEP_BEFORE = "    if {guard}:\n        optimizer.step(); optimizer.zero_grad()\n    (model(b) / K).backward()\n"


@pytest.mark.parametrize(
    ("header", "guard", "body", "expected"),
    [
        # counters from 0 (enumerate, range, i = 0 with the increment after the test)
        ("for i, b in enumerate(loader):", "i % K == 0", _STEP_AFTER, "error"),
        ("for i, b in enumerate(loader):", "not i % K", _STEP_AFTER, "error"),
        ("for i, b in enumerate(loader):", "i > 0 and i % K == 0", _STEP_AFTER, "error"),  # K + 1
        ("for i, b in enumerate(loader):", "i % K == 0 or i + 1 == len(loader)", _STEP_AFTER, "error"),
        ("for i in range(n):", "i % K == 0", _STEP_AFTER, "error"),
        ("for i, b in enumerate(loader):", "(i + 1) % K == 0", _STEP_BEFORE, "error"),  # K - 1
        ("for i in range(start, n):", "i % K == 0", _STEP_AFTER, "warning"),  # start unknown
        ("for i, b in enumerate(loader, resume):", "i % K == 0", _STEP_AFTER, "warning"),
        # right: K micro-batches in the first window
        ("for i, b in enumerate(loader):", "(i + 1) % K == 0", _STEP_AFTER, None),
        ("for i, b in enumerate(loader):", "i % K == K - 1", _STEP_AFTER, None),
        ("for i, b in enumerate(loader, 1):", "i % K == 0", _STEP_AFTER, None),
        ("for i, b in enumerate(loader, start=1):", "i % K == 0", _STEP_AFTER, None),
        ("for i in range(1, n + 1):", "i % K == 0", _STEP_AFTER, None),
        ("for i, b in enumerate(loader):", "i > 0 and i % K == 0", _STEP_BEFORE, None),
        ("for i, b in enumerate(loader):", "i % K == 0", _STEP_BEFORE, None),  # a no-op first step
        # a guard that is not only the counter: cannot tell
        ("for i, b in enumerate(loader):", "i % K == 0 and ready", _STEP_AFTER, None),
    ],
)
def test_off_by_one_counter(header: str, guard: str, body: str, expected: str | None) -> None:
    # (the end-of-pass flush, ``or i + 1 == len(loader)``, also draws AG141's warning about
    # the tail divided by K: another rule's finding, tested in its own place)
    got = [f for f in found(header + "\n" + body.format(guard=guard)) if f[0] != "AG141"]
    assert got == ([] if expected is None else [("AG115", 3 if body is _STEP_AFTER else 2, expected)])


@pytest.mark.parametrize(
    ("before", "after", "init", "expected"),
    [
        ("", "    i += 1\n", "i = 0", "error"),  # counted after the test: 0 on the first batch
        ("    i += 1\n", "", "i = 0", None),  # counted before the test: 1 on the first batch
        ("", "    i += 1\n", "i = 1", None),
        ("", "    i += 1\n", "i = state['step']", "warning"),
    ],
)
def test_hand_kept_counter(before: str, after: str, init: str, expected: str | None) -> None:
    src = f"{init}\nwhile True:\n    b = next(it)\n{before}    (model(b) / accum).backward()\n" \
          f"    if i % accum == 0:\n        optimizer.step(); optimizer.zero_grad()\n{after}"
    line = 5 if before else 4
    assert found(src) == ([] if expected is None else [("AG115", line + 1, expected)])


def test_counter_guard_on_zero_grad_at_window_start_is_right() -> None:
    assert found("""
    for i, b in enumerate(loader):
        if i % K == 0:
            optimizer.zero_grad()
        (model(b) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()
    """) == []


def test_counter_reset_in_the_loop_is_not_judged() -> None:
    assert found("""
    n = 0
    for b in loader:
        (model(b) / K).backward()
        if n % K == 0:
            optimizer.step(); optimizer.zero_grad()
            n = 0
        n += 1
    """) == []


def test_off_by_one_message_names_the_first_window() -> None:
    src = "for i, b in enumerate(loader):\n" + _STEP_AFTER.format(guard="i > 0 and i % K == 0")
    (f,) = lint_source(src)
    assert "K + 1 micro-batches" in f.message and f.failure_class == "F13"
    assert f.severity is Severity.ERROR


# ---------------------------------------------------------------- DeepSpeed: F2 or F14?

_DS = """
import deepspeed
{prelude}
cfg = {{"train_micro_batch_size_per_gpu": 4, {ga}"gradient_clipping": 1.0, "zero_optimization": {{"stage": 2}}}}
engine, _, _, _ = deepspeed.initialize(model=m, config=cfg)
for step in range(n):
    for _ in range({k}):
        engine.backward(engine(next(it)) / {k})
    engine.step()
"""


@pytest.mark.parametrize(
    ("prelude", "ga", "k", "expected"),
    [
        ("", "", "4", "AG109"),  # absent: DeepSpeed uses 1
        ("", '"gradient_accumulation_steps": 1, ', "4", "AG109"),
        ("", '"gradient_accumulation_steps": 4, ', "4", "AG110"),
        ("GA = 4", '"gradient_accumulation_steps": GA, ', "GA", "AG110"),  # a named constant
        ("GA = 1\nK = 4", '"gradient_accumulation_steps": GA, ', "K", "AG109"),
        ("", '"gradient_accumulation_steps": args.accum, ', "args.accum", "AG110"),  # the loop's K
        ("", '"gradient_accumulation_steps": args.accum, ', "4", None),  # not in sight: no guess
        ("p.add_argument('--accum', type=int, default=8)", '"gradient_accumulation_steps": args.accum, ',
         "4", "AG110"),  # the argparse default
        ("", '"gradient_accumulation_steps": int(os.environ["GA"]), ', "4", None),
        ("", '"gradient_accumulation_steps": "auto", ', "4", None),
    ],
)
def test_deepspeed_ga_resolves_to_one_or_more(prelude: str, ga: str, k: str, expected: str | None) -> None:
    codes = [c for c, _, _ in found(_DS.format(prelude=prelude, ga=ga, k=k)) if c in ("AG109", "AG110")]
    assert codes == ([] if expected is None else [expected])


@pytest.mark.parametrize(
    ("tbs", "expected"),
    [
        ("4 * world_size", "AG109"),  # GA = tbs / (micro x W) = 1
        ("4 * accum * world_size", "AG110"),  # GA = accum, the loop's K
        ("4 * other * world_size", None),
        ("32", None),  # 32 / (4 x W): depends on W
        ("4", "AG109"),
    ],
)
def test_deepspeed_ga_derived_from_train_batch_size(tbs: str, expected: str | None) -> None:
    src = f"""
    import deepspeed
    cfg = {{"train_batch_size": {tbs}, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
           "zero_optimization": {{"stage": 1}}}}
    engine, _, _, _ = deepspeed.initialize(model=m, config=cfg)
    for i, b in enumerate(loader):
        engine.backward(engine(b) / accum)
        if (i + 1) % accum == 0:
            engine.step()
    """
    codes = [c for c, _, _ in found(src) if c in ("AG109", "AG110")]
    assert codes == ([] if expected is None else [expected])


def test_json_config_overwritten_in_the_script(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}))
    script = tmp_path / "train.py"
    body = """
    import json, deepspeed
    cfg = json.load(open("ds.json"))
    {update}
    engine, _, _, _ = deepspeed.initialize(model=m, config=cfg)
    for i, b in enumerate(loader):
        engine.backward(engine(b) / accum)
        if (i + 1) % accum == 0:
            engine.step()
    """
    script.write_text(textwrap.dedent(body.format(update="")))
    assert [f.code for f in lint_file(script)] == ["AG109"]
    script.write_text(textwrap.dedent(body.format(update='cfg["gradient_accumulation_steps"] = accum')))
    (f,) = lint_file(script)
    assert f.code == "AG110" and "updated in the script" in f.message


def test_engine_step_after_micro_loop_in_a_helper_function(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 2, '
                                      '"gradient_accumulation_steps": 4, "gradient_clipping": 0.0}')
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=m, config="ds.json")
    def train_step(engine, batch):
        for mb in batch.chunk(4):
            engine.backward(engine(mb))
        engine.step()
    """))
    assert [(f.code, f.line) for f in lint_file(script)] == [("AG110", 7)]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        # chosen after the forward: DDP ignores it, whatever its polarity (every micro-step syncs)
        ("model.no_sync() if not is_last else contextlib.nullcontext()", "AG116"),
        ("model.no_sync() if is_last else contextlib.nullcontext()", "AG116"),
    ],
)
def test_no_sync_context_chosen_after_the_forward(choice: str, expected: str) -> None:
    src = f"""
    model = DDP(net)
    for i, b in enumerate(loader):
        is_last = (i + 1) % K == 0
        loss = model(b).sum() / K
        ctx = {choice}
        with ctx:
            loss.backward()
        if is_last:
            opt.step(); opt.zero_grad()
    """
    assert found(src) == [(expected, 7, "note")]
    # the same choice before the forward is judged by its polarity (AG111 when inverted)
    before = src.replace("    loss = model(b).sum() / K\n    ctx", "    ctx").replace(
        "        loss.backward()", "        (model(b).sum() / K).backward()")
    assert [c for c, _, _ in found(before)] == (["AG111"] if "if is_last" in choice else [])


def test_inverted_no_sync_after_the_forward_on_fsdp1_is_still_inverted() -> None:
    # FSDP (v1) honours no_sync at backward time: chosen on the boundary, it skips the last sync
    src = """
    model = FSDP(net)
    for i, b in enumerate(loader):
        is_last = (i + 1) % K == 0
        loss = model(b).sum() / K
        with (model.no_sync() if is_last else contextlib.nullcontext()):
            loss.backward()
        if is_last:
            opt.step(); opt.zero_grad()
    """
    assert [c for c, _, _ in found(src)] == ["AG111"]


def test_counter_bumped_inside_a_with_block_counts_as_every_iteration() -> None:
    src = """
    step = 0
    for batch in loader:
        with torch.autocast("cuda"):
            loss = model(batch) / accum
            {bump_in_with}
        loss.backward()
        if step % accum == 0:
            optimizer.step(); optimizer.zero_grad()
        {bump_after}
    """
    assert found(src.format(bump_in_with="step += 1", bump_after="")) == []
    assert found(src.format(bump_in_with="", bump_after="step += 1")) == [("AG115", 8, "error")]
    # bumped only under a condition: not a plain micro-batch counter, not judged
    assert found(src.format(bump_in_with="", bump_after="if ok: step += 1")) == []


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("K = 4", "error"),
        ("K = cfg['gradient_accumulation_steps'] if use_ds else 1", "error"),  # computed, not 1
        ("if use_ds:\n    K = cfg['gradient_accumulation_steps']\nelse:\n    K = 1", "warning"),
        # `K = args.k` is read through to the argparse default, 1, as `args.k` itself is
        ("p.add_argument('--k', type=int, default=1)\nK = args.k", "warning"),
        ("p.add_argument('--k', type=int, default=1)", "warning"),  # args.k defaults to 1
    ],
)
def test_off_by_one_is_a_warning_when_k_may_be_1(setup: str, expected: str) -> None:
    # with K = 1, `i % 1 == 0` steps on every micro-batch: right; only K > 1 is off by one
    k = "args.k" if setup.startswith("p.add_argument") and "K =" not in setup else "K"
    src = setup + f"\nfor i, b in enumerate(loader):\n    (model(b) / {k}).backward()\n" \
        f"    if i % {k} == 0:\n        optimizer.step(); optimizer.zero_grad()\n"
    (f,) = lint_source(src)
    assert f.code == "AG115" and f.severity.value == expected
