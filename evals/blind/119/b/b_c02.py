"""Completion-only SFT of a tiny GPT-2 with Accelerate, two optimizers (2 ranks, GA 3).

Each optimizer step covers K micro-batches on each of the 2 ranks.  The window is
read ahead so the loss can be normalised by the completion-token count of the
whole window on all ranks; the token embedding (tied to the LM head) gets its
own Nesterov SGD, the transformer blocks AdamW.
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

K = 3
BS = 2
EPOCHS = 2
SEED = 5


def make_data():
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 72, (24, 18), generator=g)
    plen = torch.randint(2, 15, (24,), generator=g)
    labels = ids.clone()
    labels[torch.arange(18)[None, :] < plen[:, None]] = -100
    return TensorDataset(ids, labels)


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def token_sum(model, ids, labels):
    logits = model(input_ids=ids).logits[:, :-1].float()
    tgt = labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), ignore_index=-100, reduction="sum")


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert acc.num_processes == 2
    set_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=72, n_positions=32, n_embd=32, n_layer=2, n_head=4))
    emb = [model.transformer.wte.weight]
    rest = [p for n, p in model.named_parameters() if n != "transformer.wte.weight"]
    opt_a = torch.optim.AdamW(rest, lr=2e-3, weight_decay=0.01)
    opt_s = torch.optim.SGD(emb, lr=0.05, momentum=0.9, nesterov=True)
    loader = DataLoader(make_data(), batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    model, opt_a, opt_s, loader = acc.prepare(model, opt_a, opt_s, loader)
    W = acc.num_processes

    model.train()
    for epoch in range(EPOCHS):
        for win in windows(loader, K):
            n_local = torch.tensor(sum(int((lab[:, 1:] != -100).sum()) for _, lab in win))
            n_window = acc.gather(n_local.reshape(1)).sum().float()
            for ids, labels in win:
                with acc.accumulate(model):
                    # backward divides by K, DDP averages over W: undo both
                    loss = token_sum(model, ids, labels) * (K * W) / n_window
                    acc.backward(loss)
                    opt_a.step()
                    opt_s.step()
                    opt_a.zero_grad()
                    opt_s.zero_grad()

    if acc.is_main_process:
        m = acc.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
