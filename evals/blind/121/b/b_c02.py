"""Accelerate: a GPT-2 body and a separate classification head, two optimizers, a grown vocabulary.

* the tokenizer gained 8 special tokens -> `resize_token_embeddings` before `prepare()`
* the position table is frozen
* body: AdamW + warm-up/linear decay; head: SGD with momentum + its own constant schedule
* K = 2, both models under one `accumulate()`, a clip over both on the sync step
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2Model, get_constant_schedule, get_linear_schedule_with_warmup


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=96)
    ap.add_argument("--seed", type=int, default=3)
    return ap.parse_args()


class Head(nn.Module):
    def __init__(self, d, n_cls):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Linear(d, n_cls)

    def forward(self, h, mask):
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.proj(self.norm(pooled))


def make_data(n, vocab, seq, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    lens = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None] < lens[:, None]).float()
    y = (ids[:, 0] % 4)
    return TensorDataset(ids, mask, y)


def param_sha(*modules):
    h = hashlib.sha256()
    for m in modules:
        for _, p in m.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    a = parse()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=a.grad_accum)
    assert accelerator.num_processes == 2
    set_seed(a.seed)

    body = GPT2Model(GPT2Config(vocab_size=100, n_positions=32, n_embd=48, n_layer=2, n_head=4))
    body.resize_token_embeddings(108)  # 8 new special tokens
    body.wpe.weight.requires_grad_(False)
    head = Head(48, 4)

    data = make_data(a.n_train, 108, 24, seed=11)
    dl = DataLoader(data, batch_size=a.batch_size, shuffle=True, generator=torch.Generator().manual_seed(a.seed))

    opt_body = torch.optim.AdamW([p for p in body.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    steps = a.epochs * (len(dl) // accelerator.num_processes // a.grad_accum)
    # prepared schedulers advance num_processes times per optimizer step
    sch_body = get_linear_schedule_with_warmup(opt_body, 2 * accelerator.num_processes, steps * accelerator.num_processes)
    sch_head = get_constant_schedule(opt_head)

    body, head, opt_body, opt_head, dl, sch_body, sch_head = accelerator.prepare(
        body, head, opt_body, opt_head, dl, sch_body, sch_head)

    n_updates = 0
    for epoch in range(a.epochs):
        for ids, mask, y in dl:
            with accelerator.accumulate(body, head):
                h = body(input_ids=ids, attention_mask=mask).last_hidden_state
                loss = F.cross_entropy(head(h, mask), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(list(body.parameters()) + list(head.parameters()), 0.5)
                    n_updates += 1
                for opt, sch in ((opt_body, sch_body), (opt_head, sch_head)):
                    opt.step()
                    sch.step()
                    opt.zero_grad()
    accelerator.print(f"optimizer steps: {n_updates}")
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {param_sha(accelerator.unwrap_model(body), accelerator.unwrap_model(head))}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
