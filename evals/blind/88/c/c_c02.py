"""GRPO-style policy update on 2 spawned ranks without a DDP wrapper.

Each rank holds a shard of pre-generated completions of varying length. A window
is up to ACCUM micro-batches; its loss is the sum of per-token losses over the
window's completion tokens on ALL ranks. Gradients are summed over ranks by hand
once per window. The epoch has 7 micro-batches per rank, so every epoch ends in
a 3-micro-batch window, which is normalised over its own token count.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 40208
VOCAB, DIM, PROMPT, MAXLEN = 64, 32, 6, 14
GROUP = 4            # completions per prompt
PROMPTS_PER_MICRO = 1
MICRO_PER_EPOCH = 7
ACCUM = 4
EPOCHS = 3
BETA = 0.04
CLIP_EPS = 0.2
LR = 1e-3


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(PROMPT + MAXLEN, DIM)
        self.mix = nn.GRU(DIM, DIM, batch_first=True)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h, _ = self.mix(self.tok(ids) + self.pos(torch.arange(ids.size(1))))
        return self.out(h)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def token_logps(model, ids):
    logits = model(ids[:, :-1])
    return torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def build_shard(rank, policy, ref):
    """Pre-generated rollouts: ids, completion mask, group-relative advantages, old logps."""
    g = torch.Generator().manual_seed(4242 + rank)
    shard = []
    for _ in range(MICRO_PER_EPOCH):
        n = GROUP * PROMPTS_PER_MICRO
        prompt = torch.randint(1, VOCAB, (PROMPTS_PER_MICRO, PROMPT), generator=g).repeat_interleave(GROUP, 0)
        comp = torch.randint(1, VOCAB, (n, MAXLEN), generator=g)
        lens = torch.randint(2, MAXLEN + 1, (n,), generator=g)
        cmask = torch.arange(MAXLEN).view(1, -1) < lens.view(-1, 1)
        comp[~cmask] = 0
        ids = torch.cat([prompt, comp], 1)
        mask = torch.cat([torch.zeros(n, PROMPT - 1, dtype=torch.bool), cmask], 1)
        reward = (comp == 7).float().sum(1) - 0.05 * lens.float() + 0.1 * torch.randn(n, generator=g)
        r = reward.view(-1, GROUP)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        with torch.no_grad():
            old = token_logps(policy, ids)
            refl = token_logps(ref, ids)
        shard.append((ids, mask, adv, old, refl))
    return shard


def windows(shard):
    for i in range(0, len(shard), ACCUM):
        yield shard[i:i + ACCUM]


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(7)
    policy = Policy()
    ref = Policy()
    ref.load_state_dict(policy.state_dict())
    ref.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    shard = build_shard(rank, policy, ref)

    step = 0
    for epoch in range(EPOCHS):
        for win in windows(shard):
            n_tok = torch.tensor(float(sum(int(m.sum()) for _, m, *_ in win)))
            dist.all_reduce(n_tok)
            for ids, mask, adv, old, refl in win:
                logp = token_logps(policy, ids)
                ratio = (logp - old).exp()
                a = adv.unsqueeze(1)
                pg = -torch.min(ratio * a, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * a)
                kl = (refl - logp).exp() - (refl - logp) - 1
                per_tok = pg + BETA * kl
                loss = (per_tok * mask).sum() / n_tok
                loss.backward()
            for p in policy.parameters():
                dist.all_reduce(p.grad)  # loss already over all ranks' tokens: a plain sum
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} steps {step}")
    if rank == 0:
        print("FINAL_SHA256", final_sha(policy))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
