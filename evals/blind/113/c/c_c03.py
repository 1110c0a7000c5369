"""
GRPO-style policy optimisation of a tiny causal LM, 2 DDP ranks (torchrun, gloo).

* the base vocabulary (30 tokens) is grown by two special tokens (<eos>, <pad>) before
  the DDP wrap; both the input table and the output head are resized
* forward passes run under CPU bf16 autocast (fp32 parameters and gradients)
* per iteration each rank samples 9 prompt groups (G = 4 completions each); one group
  is one micro-batch, K = 4, so the windows are 4-4-1
* the loss is a token sum over response tokens, normalised by the window's response-token
  count over all ranks, times W (DDP's averaging divides by W again)
* warm-up + cosine schedule stepped once per optimizer step, clip at 1.0
"""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 11
BASE_VOCAB = 30
EOS, PAD = BASE_VOCAB, BASE_VOCAB + 1
PROMPT_LEN, MAX_NEW = 4, 6
G = 4
GROUPS_PER_ITER = 9
K = 4
ITERS = 3
LR, WARMUP = 2e-3, 2
GOOD = set(range(0, 10))  # reward: share of response tokens in 0..9, bonus for stopping


class TinyLM(nn.Module):
    def __init__(self, vocab, d=32, n_layer=2, n_head=2, max_len=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, n_head, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        T = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        h = self.tok(ids) + self.pos(torch.arange(T))
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def resize_vocab(model, new_vocab):
    old_tok, old_head = model.tok, model.head
    d = old_tok.embedding_dim
    tok, head = nn.Embedding(new_vocab, d), nn.Linear(d, new_vocab, bias=False)
    with torch.no_grad():
        mean = old_tok.weight.mean(0, keepdim=True)
        tok.weight.copy_(mean.expand(new_vocab, d))
        tok.weight[: old_tok.num_embeddings] = old_tok.weight
        head.weight.zero_()
        head.weight[: old_head.out_features] = old_head.weight
    model.tok, model.head = tok, head
    return model


@torch.no_grad()
def sample_group(policy, prompt, gen):
    ids = prompt.unsqueeze(0).repeat(G, 1)
    done = torch.zeros(G, dtype=torch.bool)
    for _ in range(MAX_NEW):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = policy(ids)[:, -1].float()
        logits[:, PAD] = -1e9
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == EOS
    resp = ids[:, PROMPT_LEN:]
    mask = resp != PAD
    good = torch.tensor([[int(t) in GOOD for t in row] for row in resp]).float()
    stopped = (resp == EOS).any(1).float()
    reward = (good * mask).sum(1) / mask.sum(1) + 0.5 * stopped
    adv = (reward - reward.mean()) / (reward.std() + 1e-4)
    return {"ids": ids, "mask": mask, "adv": adv, "reward": reward}


def group_token_loss_sum(policy, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = policy(b["ids"][:, :-1])
    logp = torch.log_softmax(logits.float(), -1)
    tgt = b["ids"][:, 1:]
    tok_logp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)[:, PROMPT_LEN - 1:]
    ratio = torch.exp(tok_logp - tok_logp.detach())  # on-policy single step
    per_tok = -ratio * b["adv"][:, None]
    return (per_tok * b["mask"]).sum()


def main():
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    base = TinyLM(BASE_VOCAB)
    base = resize_vocab(base, BASE_VOCAB + 2)
    model = DDP(base)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    total_updates = ITERS * math.ceil(GROUPS_PER_ITER / K)

    def lr_lambda(s):
        if s < WARMUP:
            return (s + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / max(1, total_updates - WARMUP)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    gen = torch.Generator().manual_seed(SEED + 31 * rank)

    updates = 0
    for it in range(ITERS):
        model.eval()
        prompts = torch.randint(10, BASE_VOCAB, (GROUPS_PER_ITER, PROMPT_LEN), generator=gen)
        groups = [sample_group(model.module, p, gen) for p in prompts]
        model.train()
        for w0 in range(0, len(groups), K):
            window = groups[w0: w0 + K]
            n_tok = torch.tensor(float(sum(int(b["mask"].sum()) for b in window)))
            dist.all_reduce(n_tok)
            for j, b in enumerate(window):
                ctx = nullcontext() if j == len(window) - 1 else model.no_sync()
                with ctx:
                    loss = group_token_loss_sum(model, b) * W / n_tok
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            updates += 1
        if rank == 0:
            mean_r = torch.cat([g["reward"] for g in groups]).mean().item()
            print(f"iter {it}: updates {updates} mean reward {mean_r:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.module.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
