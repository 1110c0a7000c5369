"""F5 under the real ``accumguard watch`` CLI, on unmodified scripts: token mean per
micro-batch / K with uneven padding is an error (exit 1, F5); the exact twins (sum / N,
mean · n_i / N, transformers given ``num_items_in_batch``) exit 0. Plain Python, a
2-rank torchrun DDP run and an HF tiny GPT-2 built from a config (no download)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from test_watch import _errors, _watch  # the watch-CLI helper of the launcher tests

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
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    if MODE.startswith("hf"):
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        model = torch.nn.Sequential(torch.nn.Embedding(V, 16), torch.nn.Linear(16, V))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
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
                else:  # mean_scaled
                    n_i = int((y != -100).sum())
                    loss = F.cross_entropy(logits, y.reshape(-1)) * n_i * world / n_total
            loss.backward()
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


@pytest.mark.parametrize(("mode", "bug"), [("mean_k", True), ("sum_n", False),
                                           ("mean_scaled", False)])
def test_plain_script(tmp_path: Path, mode: str, bug: bool) -> None:
    code, findings, _, proc = _watch(tmp_path, [sys.executable, _script(tmp_path), mode])
    assert proc.stdout.strip() == "trained"
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        f5 = next(f for f in findings if f["cls"] == "F5")
        assert "train_padded.py:" in f5["evidence"] and f5["step"] == 1
    else:
        assert code == 0 and not _errors(findings), findings


@pytest.mark.parametrize(("mode", "bug"), [("mean_k", True), ("sum_n", False)])
def test_torchrun_ddp(tmp_path: Path, mode: str, bug: bool) -> None:
    code, findings, report, _ = _watch(tmp_path, _torchrun(_script(tmp_path), mode))
    assert report["ranks"] == [0, 1]
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        assert {f["rank"] for f in findings if f["cls"] == "F5"} == {0, 1}
    else:
        assert code == 0 and not _errors(findings), findings


@pytest.mark.parametrize(("mode", "bug"), [("hf_mean", True), ("hf_items", False)])
def test_hf_gpt2_custom_loop(tmp_path: Path, mode: str, bug: bool) -> None:
    """transformers' loss: a mean when the model is not given ``num_items_in_batch``, a
    sum divided by it when it is."""
    pytest.importorskip("transformers")
    code, findings, _, _ = _watch(tmp_path, [sys.executable, _script(tmp_path), mode])
    if bug:
        assert code == 1 and _errors(findings) == {"F5"}, findings
        f5 = next(f for f in findings if f["cls"] == "F5")
        assert "train_padded.py:" in f5["evidence"]  # the user's line, not transformers'
    else:
        assert code == 0 and not _errors(findings), findings
