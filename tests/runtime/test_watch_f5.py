"""F5 under the real ``accumguard watch`` CLI, on unmodified scripts: token mean per
micro-batch / K with uneven padding is an error (exit 1, F5); the exact twins (sum / N,
mean · n_i / N, transformers given ``num_items_in_batch``) exit 0. Plain Python, a
2-rank torchrun DDP run and an HF tiny GPT-2 built from a config (no download).

The script's cases run in two launches (tests/watch_sweep.py: one ``python``, one
``torchrun``), each recorded as ``watch`` records it and judged by the function the CLI
calls; tests/runtime/test_watch.py launches the real CLI."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

from helpers import free_port

SCRIPT = textwrap.dedent('''
    """Accumulation over uneven padding: K micro-batches per optimizer step."""
    import os
    import sys

    import torch
    import torch.nn.functional as F

    MODE = sys.argv[1]
    K, STEPS, V = 4, 3, 32
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    import torch.distributed as dist
    if MODE.startswith("ds"):
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    elif world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    if MODE.startswith("hf"):
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        model = torch.nn.Sequential(torch.nn.Embedding(V, 16), torch.nn.Linear(16, V))
    if MODE.startswith("ds"):  # native accumulation: engine.backward divides by GA = K
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": K,
                  "zero_optimization": {"stage": 2}, "gradient_clipping": 0.0,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
        model, _, _, _ = deepspeed.initialize(model=model, config=config,
                                              model_parameters=model.parameters())
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = None if MODE.startswith("ds") else torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + rank)

    def batch():
        x = torch.randint(0, V, (2, 12), generator=gen)
        y = x.clone()
        y[:, int(torch.randint(2, 12, (1,), generator=gen)):] = -100  # uneven padding
        return x, y

    for step in range(STEPS):
        batches = [batch() for _ in range(K)]
        shift = 1 if MODE.startswith("hf") else 0  # causal LM: labels shifted by one
        n_local = sum(int((y[:, shift:] != -100).sum()) for _, y in batches)
        n_total = torch.tensor(n_local)
        if world > 1:
            dist.all_reduce(n_total)
        for x, y in batches:
            if MODE == "ds_torch":  # torch's backward on the engine's loss: DeepSpeed
                # divides by GA in hooks on the forward's outputs (right, and silent)
                F.cross_entropy(model(x).reshape(-1, V), x.reshape(-1)).backward()
                model.step()
                continue
            if MODE == "ds_nogas":  # the engine's own /K switched off on a full mean: K x
                loss = F.cross_entropy(model(x).reshape(-1, V), x.reshape(-1))
                model.backward(loss, scale_wrt_gas=False)
                model.step()
                continue
            if MODE.startswith("ds"):
                logits = model(x).reshape(-1, V)
                if MODE == "ds_mean":
                    loss = F.cross_entropy(logits, y.reshape(-1))
                else:  # the engine divides by K and averages over ranks
                    loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") \\
                        * K * world / n_total
                model.backward(loss)
                model.step()
                continue
            if MODE.startswith("hf"):
                if MODE == "hf_mean":  # the 2024 bug: num_items_in_batch ignored
                    loss = model(input_ids=x, labels=y).loss / K
                else:
                    loss = model(input_ids=x, labels=y, num_items_in_batch=n_total).loss
            else:
                logits = model(x).reshape(-1, V)
                if MODE == "mean_k":
                    loss = F.cross_entropy(logits, y.reshape(-1), ignore_index=-100) / K
                elif MODE == "sum_n":  # DDP averages over ranks: times the world size
                    loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") \\
                        * world / n_total
                elif MODE == "rank_n":  # each rank by its own count: F6
                    loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") / n_local
                else:  # mean_scaled
                    n_i = int((y != -100).sum())
                    loss = F.cross_entropy(logits, y.reshape(-1)) * n_i * world / n_total
            loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print("trained")
''')


def _script(tmp_path: Path) -> str:
    path = tmp_path / "train_padded.py"
    path.write_text(SCRIPT)
    return str(path)


def _torchrun(script: str, mode: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, mode]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("f5_local")
    script = _script(tmp)
    return watch_many(tmp / "runs", {mode: [sys.executable, script, mode] for mode in (
        "mean_k", "sum_n", "mean_scaled", "hf_mean", "hf_items")})


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("deepspeed")
    tmp = tmp_path_factory.mktemp("f5_ranks")
    script = _script(tmp)
    return watch_many(tmp / "runs", {mode: _torchrun(script, mode) for mode in (
        "mean_k", "sum_n", "rank_n", "ds_mean", "ds_sum", "ds_nogas", "ds_torch")})


@pytest.mark.parametrize(("mode", "bug"), [("mean_k", True), ("sum_n", False),
                                           ("mean_scaled", False)])
def test_plain_script(local: dict[str, Watched], mode: str, bug: bool) -> None:
    code, findings, _, proc = local[mode]
    assert proc.stdout.strip() == "trained"
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        f5 = next(f for f in findings if f["cls"] == "F5")
        assert "train_padded.py:" in f5["evidence"] and f5["step"] == 1
    else:
        assert code == 0 and not _errors(findings), findings


@pytest.mark.parametrize(("mode", "bug"), [("mean_k", True), ("sum_n", False),
                                           ("rank_n", True)])
def test_torchrun_ddp(ranks: dict[str, Watched], mode: str, bug: bool) -> None:
    """Per rank: a token mean / K is F5 on both ranks; the global count is silent; each
    rank dividing by its own count (one weight per rank, different across ranks, DDP
    averaging the ranks) is common DDP practice but not the large batch: an F6 error (the
    loss-weight ledger), exit 1."""
    code, findings, report, _ = ranks[mode]
    assert report["ranks"] == [0, 1]
    if mode == "rank_n":
        assert code == 1 and _errors(findings) == {"F6"}, findings
    elif bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        # one finding per rank, or one naming both when they found it at the same step
        f5 = [f for f in findings if f["cls"] == "F5"]
        assert {f["rank"] for f in f5} == {0, 1} or (
            [f["rank"] for f in f5] == [None] and "every rank (0, 1)" in f5[0]["evidence"])
    else:
        assert code == 0 and not _errors(findings), findings
        assert not any(f["cls"] == "F6" for f in findings), findings


@pytest.mark.parametrize(("mode", "bug"), [("hf_mean", True), ("hf_items", False)])
def test_hf_gpt2_custom_loop(local: dict[str, Watched], mode: str, bug: bool) -> None:
    """transformers' loss: a mean when the model is not given ``num_items_in_batch``, a
    sum divided by it when it is."""
    code, findings, _, _ = local[mode]
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        f5 = next(f for f in findings if f["cls"] == "F5")
        assert "train_padded.py:" in f5["evidence"]  # the user's line, not transformers'
    else:
        assert code == 0 and not _errors(findings), findings


def _padded_batches(n: int, v: int) -> list[Any]:
    """``n`` micro-batches of 2x8 tokens with 4, 8 or 12 valid labels (the rest -100)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    data = []
    for i in range(n):
        x = torch.randint(0, v, (2, 8), generator=gen)
        y = x.clone()
        y[:, 2 + 2 * (i % 3):] = -100
        data.append((x, y.reshape(-1)))
    return data


def test_accelerate_accumulate_in_process(tmp_path: Path) -> None:
    """``accelerator.backward`` divides every micro-step's loss by K (a constant: it cancels).
    Over it, a token mean is F5 (issue 12) and the summed loss times K / N is exact."""
    pytest.importorskip("accelerate")
    import torch
    import torch.nn.functional as F  # noqa: N812
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from accumguard.watch._findings import analyze, load_recordings
    from accumguard.watch._recording import recording

    k, v = 4, 16
    for mode in ("exact", "mean"):
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        acc = Accelerator(gradient_accumulation_steps=k, cpu=True)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(v, 8), torch.nn.Linear(8, v))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        data = _padded_batches(2 * k, v)
        out = tmp_path / mode
        with recording(out):
            for s in range(2):
                window = data[s * k:(s + 1) * k]
                total = sum(int((y != -100).sum()) for _, y in window)
                for x, y in window:
                    with acc.accumulate(model):
                        z = model(x).reshape(-1, v)
                        loss = (F.cross_entropy(z, y) if mode == "mean"
                                else F.cross_entropy(z, y, reduction="sum") * k / total)
                        acc.backward(loss)
                        opt.step()
                        opt.zero_grad()
        findings, got_k, _ = analyze(load_recordings(out))
        errors = {f.cls for f in findings if f.severity == "error"}
        assert got_k == k
        assert errors == ({"F5"} if mode == "mean" else set()), (mode, findings)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.deepspeed
@pytest.mark.parametrize(("mode", "bug"), [("ds_mean", True), ("ds_sum", False)])
def test_deepspeed_native_accumulation(ranks: dict[str, Watched], mode: str, bug: bool) -> None:
    """DeepSpeed ZeRO-2, config GA = K, ``engine.backward`` on every micro-batch (it divides
    by K: a constant that cancels): a token mean is F5, the summed loss over N is exact."""
    code, findings, report, _ = ranks[mode]
    assert report["ranks"] == [0, 1] and report["accumulation_steps"] == 4
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
    else:
        assert code == 0 and not _errors(findings), findings


@pytest.mark.deepspeed
def test_deepspeed_scale_wrt_gas_false_on_a_mean(ranks: dict[str, Watched]) -> None:
    """``engine.backward(loss, scale_wrt_gas=False)`` on each micro-batch's full mean with
    GA = K in the config: nothing divides by K, the engine sums K means (blind round 80
    b_b01): LOSS_SCALE, with DeepSpeed's fix."""
    code, findings, report, _ = ranks["ds_nogas"]
    assert report["ranks"] == [0, 1] and report["accumulation_steps"] == 4
    assert code == 1 and _errors(findings) == {"LOSS_SCALE"}, findings
    scale = [f for f in findings if f["cls"] == "LOSS_SCALE"]
    assert "scale_wrt_gas" in scale[0]["fix"], scale


@pytest.mark.deepspeed
def test_deepspeed_torch_backward_on_a_mean_is_right(ranks: dict[str, Watched]) -> None:
    """``loss.backward()`` (torch's) on the engine's mean loss with GA = K: DeepSpeed 0.19
    divides by GA in hooks on the forward's outputs, which the loss weights do not show; the
    run is right and no LOSS_SCALE may be said (the engine-sum reading applies only to
    ``engine.backward``)."""
    code, findings, report, _ = ranks["ds_torch"]
    assert report["ranks"] == [0, 1] and report["accumulation_steps"] == 4
    assert code == 0 and not _errors(findings), findings


def test_lightning_accumulate_grad_batches_in_process(tmp_path: Path) -> None:
    """Lightning divides each micro-batch's loss by ``accumulate_grad_batches`` (a constant):
    a token mean returned by ``training_step`` is F5, the summed loss times K / N exact."""
    pl = pytest.importorskip("pytorch_lightning")
    import torch
    import torch.nn.functional as F  # noqa: N812

    from accumguard.watch._findings import analyze, load_recordings
    from accumguard.watch._recording import recording

    k, v = 4, 16
    data = _padded_batches(2 * k, v)
    window_n = [sum(int((y != -100).sum()) for _, y in data[s * k:(s + 1) * k])
                for s in range(2)]

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mode = mode
            self.net = torch.nn.Sequential(torch.nn.Embedding(v, 8), torch.nn.Linear(8, v))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            z = self.net(x).reshape(-1, v)
            if self.mode == "mean":
                return F.cross_entropy(z, y)
            return F.cross_entropy(z, y, reduction="sum") * k / window_n[batch_idx // k]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    for mode in ("exact", "mean"):
        torch.manual_seed(0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1,
                             accumulate_grad_batches=k, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        out = tmp_path / mode
        with recording(out):
            trainer.fit(Module(mode), loader)
        findings, _, _ = analyze(load_recordings(out), k_flag=k)
        errors = {f.cls for f in findings if f.severity == "error"}
        assert errors == ({"F5"} if mode == "mean" else set()), (mode, findings)


def test_hf_trainer_compute_loss_override_in_process(tmp_path: Path) -> None:
    """The transformers ``Trainer`` (GA 4): its default passes ``num_items_in_batch`` to the
    model (a sum over the window's count: silent); a ``compute_loss`` override that ignores
    it returns each micro-batch's token mean (the 2024 bug, still reproducible): F5 at the
    override's line, and LOSS_SCALE (the Trainer does not divide such a loss by K)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from accumguard.watch._findings import analyze, load_recordings
    from accumguard.watch._recording import recording

    v = 32
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(16):
        x = torch.randint(0, v, (12,), generator=gen)
        y = x.clone()
        y[int(torch.randint(2, 12, (1,), generator=gen)):] = -100
        data.append({"input_ids": x, "labels": y})

    class MeanTrainer(transformers.Trainer):  # type: ignore[misc,name-defined]
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            out = model(**inputs)  # num_items_in_batch ignored: a mean per micro-batch
            return (out.loss, out) if return_outputs else out.loss

    for cls in (transformers.Trainer, MeanTrainer):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=v, n_positions=16, n_embd=16, n_layer=2,
                                      n_head=2, bos_token_id=0, eos_token_id=0)
        out = tmp_path / cls.__name__
        with recording(out / "rec"):
            args = transformers.TrainingArguments(
                output_dir=str(out), per_device_train_batch_size=2,
                gradient_accumulation_steps=4, max_steps=2, report_to=[], save_strategy="no",
                logging_strategy="no", use_cpu=True, disable_tqdm=True)
            cls(model=transformers.GPT2LMHeadModel(cfg), args=args,
                train_dataset=data).train()
        findings, _, _ = analyze(load_recordings(out / "rec"))
        errors = {f.cls for f in findings if f.severity == "error"}
        if cls is MeanTrainer:
            # the Trainer skips its own /K for a model whose forward takes **kwargs: the
            # window also weighs K (LOSS_SCALE), seen before the default clip at 1.0
            assert errors == {"F5", "LOSS_SCALE"}, findings
            f5 = next(f for f in findings if f.cls == "F5")
            assert "test_watch_f5.py:" in f5.evidence and "not divided by K" in f5.title
            scale = next(f for f in findings if f.cls == "LOSS_SCALE")
            assert "loss 4x too large" in scale.title
        else:
            assert not errors, findings
