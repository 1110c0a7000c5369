"""RLOO-style policy-gradient fine-tuning of a tiny causal LM, DDP on 2 ranks.

A frozen reference model gives a KL penalty. Each rollout buffer is split into
micro-batches; updates accumulate ACCUM micro-batches and the last window of a
buffer may be short. The loss is a sum over completion tokens divided by the
window's completion-token count over all ranks (times W, undoing DDP's mean).
Training is checkpointed at an update boundary and resumed into fresh objects.
"""
import os
import copy
import hashlib
import contextlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

V, D, T, P = 24, 32, 12, 4  # vocab, width, sequence length, prompt length
ACCUM = 4
MICRO_PER_BUFFER = 10       # windows of 4, 4, 2
MICRO_BS = 4
BUFFERS = 3
KL_COEF = 0.05
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c01_ckpt.pt")


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.mix = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        h, _ = self.mix(self.emb(ids) + self.pos[: ids.shape[1]])
        return self.head(h)


def rollout(policy, g):
    """Sampled sequences with a completion mask of uneven length, and their rewards."""
    ids = torch.randint(0, V, (MICRO_BS, T), generator=g)
    comp_len = torch.randint(2, T - P + 1, (MICRO_BS,), generator=g)
    mask = torch.zeros(MICRO_BS, T)
    for b in range(MICRO_BS):
        mask[b, P:P + comp_len[b]] = 1.0
    reward = (ids[:, P:] % 3 == 0).float().mul(mask[:, P:]).sum(1) / comp_len
    adv = reward - reward.mean()   # leave-one-out style baseline within the micro-batch
    return ids, mask, adv * MICRO_BS / (MICRO_BS - 1)


def token_logps(model, ids):
    logits = model(ids[:, :-1])
    return torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(-1)


def build(rank):
    torch.manual_seed(0)
    policy = TinyLM()
    ref = copy.deepcopy(policy).requires_grad_(False)
    ddp = DDP(policy)
    decay = [p for n, p in policy.named_parameters() if p.dim() >= 2 and n != "pos"]
    no_decay = [p for n, p in policy.named_parameters() if not (p.dim() >= 2 and n != "pos")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return ddp, ref, opt, sched


def train_buffer(ddp, ref, opt, sched, buf, world):
    for w0 in range(0, len(buf), ACCUM):
        window = buf[w0:w0 + ACCUM]
        n_tok = torch.tensor([sum(m[:, 1:].sum() for _, m, _ in window)])
        dist.all_reduce(n_tok)
        opt.zero_grad(set_to_none=True)
        for i, (ids, mask, adv) in enumerate(window):
            ctx = contextlib.nullcontext() if i == len(window) - 1 else ddp.no_sync()
            with ctx:
                lp = token_logps(ddp, ids)
                with torch.no_grad():
                    ref_lp = token_logps(ref, ids)
                m = mask[:, 1:]
                pg = -(adv[:, None] * lp * m).sum()
                kl = ((lp - ref_lp) * m).sum()
                loss = (pg + KL_COEF * kl) * world / n_tok.item()
                loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
        opt.step()
        sched.step()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(31 + rank)
    buffers = [[rollout(None, g) for _ in range(MICRO_PER_BUFFER)] for _ in range(BUFFERS)]

    ddp, ref, opt, sched = build(rank)
    train_buffer(ddp, ref, opt, sched, buffers[0], world)
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "ref": ref.state_dict(),
                    "opt": opt.state_dict(), "sched": sched.state_dict()}, CKPT)
    dist.barrier()
    del ddp, ref, opt, sched

    ddp, ref, opt, sched = build(rank)   # fresh objects, restored from disk
    state = torch.load(CKPT)
    ddp.module.load_state_dict(state["model"])
    ref.load_state_dict(state["ref"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    for buf in buffers[1:]:
        train_buffer(ddp, ref, opt, sched, buf, world)

    h = hashlib.sha256()
    for _, p in ddp.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
