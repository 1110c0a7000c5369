"""The four bug shapes a blind evaluation found lint silent on, as classes of code shapes:
an HF ``Trainer.compute_loss`` mean (AG118, F5), an epoch's leftover leaking into the next
epoch (AG117, F7), the sync enabled on the first micro-step of the window (AG111, F11),
and a DeepSpeed loop whose K is the engine's own GA around one ``step()`` (AG110, F14).
Each case varies one thing against its correct twin."""

from __future__ import annotations

import ast
import textwrap

import pytest

from accumguard.static.lint import lint_source
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._lengths import static_len


def found(src: str, select: str | None = None) -> list[tuple[str, int, str]]:
    out = lint_source(textwrap.dedent(src), select=[select] if select else None)
    return [(f.code, f.line or 0, f.severity.value) for f in out]


# ---------------------------------------------------------------- AG118: HF compute_loss

_HF = """
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        {body}
        return loss


args = TrainingArguments(output_dir="o"{ga})
"""


@pytest.mark.parametrize(
    ("body", "ga", "expected"),
    [
        ("loss = F.cross_entropy(outputs.logits, labels, ignore_index=-100)", ", gradient_accumulation_steps=4",
         [("AG118", 10, "error")]),
        ("loss = F.cross_entropy(outputs.logits, labels, reduction='mean')", ", gradient_accumulation_steps=4",
         [("AG118", 10, "error")]),
        ("loss = nn.CrossEntropyLoss()(outputs.logits, labels)", ", gradient_accumulation_steps=2",
         [("AG118", 10, "error")]),
        ("loss = outputs.loss", ", gradient_accumulation_steps=8", [("AG118", 10, "error")]),
        ("loss = outputs['loss']", ", gradient_accumulation_steps=8", [("AG118", 10, "error")]),
        # GA from a config spread: not in sight, a warning
        ("loss = outputs.loss", ", **cfg", [("AG118", 10, "warning")]),
        # no accumulation: a mean per batch is the large-batch loss
        ("loss = outputs.loss", "", []),
        ("loss = outputs.loss", ", gradient_accumulation_steps=1", []),
        # uses num_items_in_batch
        ("loss = F.cross_entropy(outputs.logits, labels, reduction='sum') / num_items_in_batch",
         ", gradient_accumulation_steps=4", []),
        ("loss = model(**inputs, labels=labels, num_items_in_batch=num_items_in_batch).loss",
         ", gradient_accumulation_steps=4", []),
        # (not AG118's: the parent gets no count, AG350's)
        ("loss = super().compute_loss(model, inputs)", ", gradient_accumulation_steps=4",
         [("AG350", 10, "error")]),
        ("loss = super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)",
         ", gradient_accumulation_steps=4", []),
        # num_items_in_batch read for an extra term only; the model's .loss is its own mean
        # (blind round 49 a_b01)
        ("n_tok = num_items_in_batch if num_items_in_batch is not None else 1\n        "
         "loss = outputs.loss - 0.1 * self.entropy_sum(outputs.logits) / n_tok",
         ", gradient_accumulation_steps=4", [("AG118", 11, "error")]),
        ("loss = (outputs.loss * 5 + outputs.logits.sum()) / num_items_in_batch",
         ", gradient_accumulation_steps=4", []),
        # a sum the rule cannot call a mean: not this rule's business
        ("loss = F.cross_entropy(outputs.logits, labels, reduction='sum')", ", gradient_accumulation_steps=4", []),
    ],
)
def test_hf_compute_loss_mean(body: str, ga: str, expected: list[tuple[str, int, str]]) -> None:
    assert found(_HF.format(body=body, ga=ga)) == expected


def test_hf_compute_loss_scale_flag_and_plain_classes() -> None:
    src = _HF.format(body="loss = outputs.loss", ga=", gradient_accumulation_steps=4")
    flagged = lint_source(textwrap.dedent(src))
    assert "K times too large" in flagged[0].message and flagged[0].failure_class == "F5"
    # the class says the Trainer must divide by K: only the mean of means is left (warning)
    declared = src.replace("class T(Trainer):", "class T(Trainer):\n    loss_is_scaled_for_ga = False")
    only = lint_source(textwrap.dedent(declared))
    assert [f.severity.value for f in only] == ["warning"] and "K times" not in only[0].message
    # not a Trainer subclass: a method that happens to be called compute_loss
    assert found(src.replace("class T(Trainer):", "class T(Base):")) == []
    # **kwargs handed on carries num_items_in_batch
    fwd = src.replace("num_items_in_batch=None):", "**kwargs):").replace(
        "outputs = model(**inputs)", "outputs = model(**inputs, **kwargs)")
    assert found(fwd) == []


# ---------------------------------------------------------------- AG117: epoch leftover

_EPOCHS = """
import torch
from torch.utils.data import DataLoader, TensorDataset

K = 4
loader = DataLoader(TensorDataset(torch.randn({n}, 3), torch.randn({n}, 1)), batch_size=5{drop})
for epoch in range(3):
    {before}
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / K).backward()
        if {guard}:
            optimizer.step()
            optimizer.zero_grad()
    {after}
"""


@pytest.mark.parametrize(
    ("n", "drop", "before", "guard", "after", "expected"),
    [
        # 10 batches, K = 4: 2 left over every epoch
        (50, "", "pass", "(i + 1) % K == 0", "pass", [("AG117", 11, "error")]),
        # 12 batches: a multiple of K, nothing left over
        (60, "", "pass", "(i + 1) % K == 0", "pass", []),
        # 52 samples: 11 batches, or 10 with drop_last
        (52, "", "pass", "(i + 1) % K == 0", "pass", [("AG117", 11, "error")]),
        (52, ", drop_last=False", "pass", "(i + 1) % K == 0", "pass", [("AG117", 11, "error")]),
        (47, ", drop_last=True", "pass", "(i + 1) % K == 0", "pass", [("AG117", 11, "error")]),  # 9
        (42, ", drop_last=True", "pass", "(i + 1) % K == 0", "pass", []),  # 8 batches
        # a sampler decides the length: not in sight, a warning
        (50, ", sampler=sampler", "pass", "(i + 1) % K == 0", "pass", [("AG117", 11, "warning")]),
        # the guard flushes the end of the data: no leak, but the 2-batch tail is still
        # divided by K = 4 (AG141, F7: its update is 2/4 of the large batch's)
        (50, "", "pass", "(i + 1) % K == 0 or i + 1 == len(loader)", "pass",
         [("AG141", 10, "error")]),
        # a flush after the loop (the tail, still divided by K: AG141), or the gradients
        # dropped at the start of each epoch
        (50, "", "pass", "(i + 1) % K == 0", "optimizer.step(); optimizer.zero_grad()",
         [("AG141", 10, "error")]),
        # a flush with nothing clearing after it: the tail's gradient is applied there and
        # again in the next epoch's first window (blind round 38 c_b03)
        (50, "", "pass", "(i + 1) % K == 0", "optimizer.step()",
         [("AG141", 10, "error"), ("AG117", 11, "error")]),
        (50, "", "optimizer.zero_grad()", "(i + 1) % K == 0", "pass", []),
        (50, "", "pass", "(i + 1) % K == 0", "model.zero_grad(set_to_none=True)", []),
        # off by one is AG115's, not a leftover
        (50, "", "pass", "i % K == 0", "pass", [("AG115", 11, "error")]),
    ],
)
def test_epoch_leftover(n: int, drop: str, before: str, guard: str, after: str, expected: list) -> None:
    src = _EPOCHS.format(n=n, drop=drop, before=before, guard=guard, after=after)
    assert found(src) == expected


def test_epoch_leftover_counter_scope() -> None:
    src = """
    step = 0
    for epoch in range(epochs):
        {reset}
        for x, y in loader:
            (loss_fn(model(x), y) / accum_steps).backward()
            step += 1
            if step % accum_steps == 0:
                opt.step()
                opt.zero_grad()
    """
    # reset every epoch: the leftover leaks (length not in sight: a warning)
    assert found(src.format(reset="step = 0")) == [("AG117", 8, "warning")]
    # one counter across epochs: windows span epochs, K micro-batches each
    assert found(src.format(reset="pass")) == []


def test_epoch_leftover_needs_repetition() -> None:
    one_pass = """
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / accum_steps).backward()
        if (i + 1) % accum_steps == 0:
            opt.step()
            opt.zero_grad()
    """
    assert found(one_pass) == []
    per_epoch = "def train_one_epoch(model, loader, opt, accum_steps):\n" + textwrap.indent(
        textwrap.dedent(one_pass), "    ")
    assert found(per_epoch) == [("AG117", 5, "warning")]
    assert found(per_epoch.replace("train_one_epoch", "fit")) == []
    # K may be 1 in some configuration of the file: nothing is ever left over then
    fallback = "if big:\n    accum_steps = 8\nelse:\n    accum_steps = 1\n" + per_epoch.replace(
        "def train_one_epoch(model, loader, opt, accum_steps):", "def train_one_epoch(model, loader, opt):")
    assert found(fallback) == []
    assert found(fallback.replace("accum_steps = 1", "accum_steps = 2")) == [("AG117", 9, "warning")]


def test_static_length_shapes() -> None:
    def length(setup: str, expr: str) -> int | None:
        tree = ast.parse(textwrap.dedent(setup) + f"\n_probe = {expr}\n")
        ctx = FileContext(tree, None)
        return static_len(ctx, tree.body[-1].value)  # type: ignore[attr-defined]

    assert length("data = [(1, 2) for _ in range(10)]", "data") == 10
    assert length("", "enumerate(range(3, 12, 2))") == 5
    assert length("x = torch.randint(0, 4, (50,))", "DataLoader(TensorDataset(x), batch_size=8)") == 7
    assert length("x = torch.randint(0, 4, (50,))", "DataLoader(TensorDataset(x), 8, drop_last=True)") == 6
    assert length("N = 30\nB = 4", "DataLoader(TensorDataset(torch.zeros((N, 2))), batch_size=B)") == 8
    assert length("", "DataLoader(ds, batch_size=4)") is None  # a dataset class: unknown
    assert length("data = [1, 2]\ndata = [1, 2, 3]", "data") is None  # assigned twice: unknown
    assert length("", "DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=4)") is None


# ---------------------------------------------------------------- AG111: sync on the first micro-step


_NO_SYNC = """
from contextlib import nullcontext
model = DDP(net)
for update in range(n):
    for micro_step in range(accum_iter):
        ctx = {expr}
        with ctx:
            (model(xs[micro_step]).sum() / accum_iter).backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("nullcontext() if micro_step == 0 else model.no_sync()", ["AG111"]),
        ("nullcontext() if not micro_step else model.no_sync()", ["AG111"]),
        ("model.no_sync() if micro_step != 0 else nullcontext()", ["AG111"]),
        ("model.no_sync() if micro_step > 0 else nullcontext()", ["AG111"]),
        ("model.no_sync() if micro_step >= 1 else nullcontext()", ["AG111"]),
        # the last micro-step syncs: right
        ("nullcontext() if micro_step == accum_iter - 1 else model.no_sync()", []),
        ("model.no_sync() if micro_step < accum_iter - 1 else nullcontext()", []),
        # syncs on every micro-step but the first, the last included: right (some waste)
        ("model.no_sync() if micro_step == 0 else nullcontext()", []),
        # `== 1` says nothing about the last micro-step for an unknown K
        ("nullcontext() if micro_step == 1 else model.no_sync()", []),
    ],
)
def test_no_sync_on_first_micro_step(expr: str, expected: list[str]) -> None:
    assert [c for c, _, _ in found(_NO_SYNC.format(expr=expr))] == expected


def test_sync_flag_on_first_micro_step() -> None:
    src = """
    for micro in range(K):
        model.set_requires_gradient_sync({value})
        (model(batch[micro]).mean() / K).backward()
    opt.step()
    """
    assert found(src.format(value="micro == 0")) == [("AG111", 3, "error")]
    assert found(src.format(value="micro > 0")) == []
    assert found(src.format(value="micro == K - 1")) == []
    # a 1-based counter: `i == 0` is never true, not a "first micro-step" test
    enum1 = """
    for i, mb in enumerate(window, 1):
        model.set_requires_gradient_sync(i % K == 0)
        (model(mb).mean() / K).backward()
    opt.step()
    """
    assert found(enum1) == []
    # a flag named like accumulation is not a counter
    flag = _NO_SYNC.format(expr="model.no_sync() if accumulating else nullcontext()")
    assert found(flag) == []


# ---------------------------------------------------------------- AG110: K from the engine


_DS = """
import deepspeed
engine, _, _, _ = deepspeed.initialize(args=args, model=net)
{k_line}
for update in range(n):
    for _ in range({k}):
        engine.backward(engine(next(it)).mean())
        {inner}
    {outer}
"""


@pytest.mark.parametrize(
    ("k_line", "k", "inner", "outer", "expected"),
    [
        ("gas = engine.gradient_accumulation_steps()", "gas", "pass", "engine.step()", [("AG110", 9)]),
        ("gas = int(engine.gradient_accumulation_steps())", "gas", "pass", "engine.step()", [("AG110", 9)]),
        ("", "engine.gradient_accumulation_steps()", "pass", "engine.step()", [("AG110", 9)]),
        # the engine gates: step() after every backward
        ("gas = engine.gradient_accumulation_steps()", "gas", "engine.step()", "pass", []),
        # the loop's own K, not the engine's, and no config in sight: no error, a warning (AG139)
        # naming the configs that make it wrong
        ("gas = args.accum", "gas", "pass", "engine.step()", [("AG139", 9)]),
    ],
)
def test_deepspeed_k_from_the_engine(k_line: str, k: str, inner: str, outer: str, expected: list) -> None:
    got = [(c, line) for c, line, _ in found(_DS.format(k_line=k_line, k=k, inner=inner, outer=outer))]
    assert got == expected


def test_deepspeed_k_from_the_engine_with_explicit_boundary_is_fine() -> None:
    src = _DS.format(k_line="gas = engine.gradient_accumulation_steps()", k="gas",
                     inner="engine.set_gradient_accumulation_boundary(False)", outer="engine.step()")
    assert found(src) == []


def test_epoch_leftover_length_from_the_callers() -> None:
    src = """
    def train_one_epoch(model, batches, accum):
        for i, b in enumerate(batches):
            (model(b).mean() / accum).backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()

    for epoch in range(2):
        train_one_epoch(net, [make() for _ in range({n})], 4)
    """
    def k_constant(n: int) -> str:
        return src.format(n=n).replace("/ accum", "/ ACC").replace("% accum", "% ACC") + "ACC = 4\n"

    assert found(k_constant(8)) == []  # 8 micro-batches per call, K = 4: nothing left
    assert found(k_constant(10)) == [("AG117", 5, "error")]  # 2 left every call
    # K is a parameter, and the one call passes 4: read there (blind round 17)
    assert found(src.format(n=8)) == []
    assert found(src.format(n=10)) == [("AG117", 5, "error")]
    # a call that passes K the file does not show: not in sight
    assert found(src.format(n=8).replace(", 4)", ", int(sys.argv[1]))")) == [("AG117", 5, "warning")]
