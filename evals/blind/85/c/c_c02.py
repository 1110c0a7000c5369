"""DPO with mixed precision by hand: a bf16 working copy of the policy and fp32
master weights that own the optimizer.  Two ranks via mp.spawn, data parallelism
by hand (one all-reduce of the fp32 window gradient per optimizer step).

Every micro-batch holds the same number of preference pairs, so the window's
pair mean is each micro-batch's mean / K, summed over ranks / W.  Halfway the
run checkpoints at an optimizer-step boundary, throws every object away and
resumes into freshly built ones.
"""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

V, D, P_LEN, R_LEN = 20, 32, 5, 4
PAIRS, K, TOTAL_STEPS, CKPT_AT = 4, 3, 12, 6
BETA, LR, CLIP = 0.2, 5e-3, 1.0
PORT = 38608


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.mix = nn.Conv1d(D, D, 3, padding=2)
        self.ff = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.SiLU(), nn.Linear(2 * D, D))
        self.lm_head = nn.Linear(D, V)

    def forward(self, ids):
        h = self.wte(ids)
        h = h + self.mix(h.transpose(1, 2))[..., : ids.size(1)].transpose(1, 2)
        return self.lm_head(h + self.ff(h))


def seq_logp(model, prompt, resp):
    ids = torch.cat([prompt, resp], 1)
    logits = model(ids[:, :-1]).float()
    lp = torch.log_softmax(logits[:, P_LEN - 1:], -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    return lp.sum(1)


def pairs_for(rank, step, micro):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    prompt = torch.randint(0, V, (PAIRS, P_LEN), generator=g)
    chosen = (prompt[:, -R_LEN:] + 1) % V  # preferred: shifted echo of the prompt
    rejected = torch.randint(0, V, (PAIRS, R_LEN), generator=g)
    return prompt, chosen, rejected


class MixedPrecisionDPO:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        init = TinyLM()
        self.ref = TinyLM().to(torch.bfloat16)
        self.ref.load_state_dict(init.state_dict())
        self.ref.requires_grad_(False)
        self.model = TinyLM().to(torch.bfloat16)
        self.model.load_state_dict(init.state_dict())
        self.masters = [p.detach().float().clone() for p in init.parameters()]
        self.acc = [torch.zeros_like(m) for m in self.masters]
        self.opt = torch.optim.AdamW(self.masters, lr=LR, weight_decay=0.0)
        self.step = 0

    def micro(self, batch):
        prompt, chosen, rejected = batch
        pc, pr = seq_logp(self.model, prompt, chosen), seq_logp(self.model, prompt, rejected)
        with torch.no_grad():
            rc, rr = seq_logp(self.ref, prompt, chosen), seq_logp(self.ref, prompt, rejected)
        loss = -F.logsigmoid(BETA * ((pc - rc) - (pr - rr))).mean()
        (loss / K).backward()
        for a, p in zip(self.acc, self.model.parameters()):
            a.add_(p.grad.float())
            p.grad = None

    def optimizer_step(self):
        for a, m in zip(self.acc, self.masters):
            dist.all_reduce(a)
            a.div_(self.world)
            m.grad = a
        torch.nn.utils.clip_grad_norm_(self.masters, CLIP)
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.model.parameters(), self.masters):
                p.copy_(m.to(torch.bfloat16))
        for a in self.acc:
            a.zero_()
        self.step += 1

    def train_until(self, last_step):
        while self.step < last_step:
            for k in range(K):
                self.micro(pairs_for(self.rank, self.step, k))
            self.optimizer_step()

    def state_dict(self):
        return {"masters": [m.detach().clone() for m in self.masters], "opt": self.opt.state_dict(), "step": self.step}

    def load_state_dict(self, sd):
        with torch.no_grad():
            for m, s, p in zip(self.masters, sd["masters"], self.model.parameters()):
                m.copy_(s)
                p.copy_(s.to(torch.bfloat16))
        self.opt.load_state_dict(sd["opt"])
        self.step = sd["step"]


def worker(rank, world, ckpt_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    path = os.path.join(ckpt_dir, "dpo.pt")
    t = MixedPrecisionDPO(rank, world)
    t.train_until(CKPT_AT)
    if rank == 0:
        torch.save(t.state_dict(), path)
    dist.barrier()
    del t
    t = MixedPrecisionDPO(rank, world)
    t.load_state_dict(torch.load(path))
    t.train_until(TOTAL_STEPS)
    if rank == 0:
        h = hashlib.sha256()
        names = [n for n, _ in t.model.named_parameters()]
        for _, m in zip(names, t.masters):
            h.update(m.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, d), nprocs=2, join=True)
