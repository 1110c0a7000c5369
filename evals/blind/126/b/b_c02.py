"""Accelerate with a batch-size warm-up: K = 2 in the first epoch, K = 4 afterwards.

Tiny GPT-2, vocabulary grown by 8 tokens, frozen position table, AdamW for the body and
SGD for the token embedding. Token-level loss over each window's all-ranks count.
"""
import hashlib
import random

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 5
BASE_VOCAB, EXTRA = 72, 8
PER_DEVICE = 2
ACCUM_SCHEDULE = {0: 2, 1: 4, 2: 4}   # epoch -> micro-batches per window


def build(n, vocab, seed):
    rng = random.Random(seed)
    return [[rng.randint(0, vocab - 1) for _ in range(rng.randint(4, 20))] for _ in range(n)]


def collate(rows):
    w = max(map(len, rows))
    ids = torch.zeros(len(rows), w, dtype=torch.long)
    labels = torch.full((len(rows), w), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r)] = torch.tensor(r)
    return ids, labels


def window_iter(loader, k):
    it = iter(loader)
    while True:
        win = []
        for _ in range(k):
            try:
                win.append(next(it))
            except StopIteration:
                break
        if not win:
            return
        yield win


def main():
    plugin = GradientAccumulationPlugin(num_steps=ACCUM_SCHEDULE[0], sync_with_dataloader=False)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert acc.num_processes == 2
    set_seed(SEED)

    model = GPT2LMHeadModel(GPT2Config(vocab_size=BASE_VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model.resize_token_embeddings(BASE_VOCAB + EXTRA)
    model.transformer.wpe.weight.requires_grad_(False)

    emb = [model.transformer.wte.weight]
    body = [p for n, p in model.named_parameters() if p.requires_grad and n != "transformer.wte.weight"]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_emb = torch.optim.SGD(emb, lr=0.5)

    g = torch.Generator().manual_seed(SEED)
    loader = DataLoader(build(64, BASE_VOCAB + EXTRA, SEED), batch_size=PER_DEVICE, shuffle=True,
                        generator=g, collate_fn=collate)
    model, opt_body, opt_emb, loader = acc.prepare(model, opt_body, opt_emb, loader)

    updates = 0
    for epoch, k in ACCUM_SCHEDULE.items():
        acc.gradient_accumulation_steps = k
        for win in window_iter(loader, k):
            assert len(win) == k
            local = sum(lab[:, 1:].ne(-100).sum() for _, lab in win)
            n_tok = acc.gather(local.reshape(1)).sum()
            for j, (ids, labels) in enumerate(win):
                with acc.accumulate(model):
                    assert acc.sync_gradients == (j == k - 1)
                    logits = model(input_ids=ids).logits[:, :-1].float()
                    tok_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                                              ignore_index=-100, reduction="sum")
                    # backward() divides by k, DDP averages over the processes
                    acc.backward(tok_sum / n_tok * k * acc.num_processes)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(model.parameters(), 1.0)
                    opt_body.step()
                    opt_emb.step()
                    opt_body.zero_grad()
                    opt_emb.zero_grad()
            updates += 1
        acc.print(f"epoch {epoch} K={k} updates so far {updates}")

    acc.wait_for_everyone()
    if acc.is_main_process:
        m = acc.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in m.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
