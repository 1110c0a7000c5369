# DPO by hand on two mp.spawn ranks without a DDP wrapper: frozen reference copy, frozen token
# embedding in the policy, micro-batches with different numbers of preference pairs, the loss
# normalised by the window's all-ranks pair count and gradients summed with one all-reduce per
# window. Each epoch has 7 micro-batches per rank with K = 3, so its last window is short.
import copy, hashlib, os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 38912
K = 3
EPOCHS = 3
MICRO_PER_EPOCH = 7
VOCAB, T, D = 50, 10, 32
BETA = 0.1
LR = 5e-3
SEED = 11


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.head(self.norm(h))


def seq_logps(model, ids, resp_mask):
    logits = model(ids[:, :-1])
    logp = torch.gather(logits.log_softmax(-1), 2, ids[:, 1:, None]).squeeze(-1)
    return (logp * resp_mask[:, 1:]).sum(-1)


def make_micro_batch(epoch, i, rank):
    g = torch.Generator().manual_seed(SEED * 7919 + epoch * 131 + i * 17 + rank)
    n = int(torch.randint(2, 7, (1,), generator=g))  # 2..6 pairs
    chosen = torch.randint(0, VOCAB, (n, T), generator=g)
    rejected = chosen.clone()
    rejected[:, 4:] = torch.randint(0, VOCAB, (n, T - 4), generator=g)
    chosen[:, 4:] = (chosen[:, 3:-1] + 1) % VOCAB  # "preferred" continuation is a pattern
    resp = torch.zeros(n, T)
    resp[:, 4:] = 1.0
    return chosen, rejected, resp


class DPOTrainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(SEED)
        self.policy = TinyLM()
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.policy.embed.weight.requires_grad_(False)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=LR, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.LinearLR(self.opt, 1.0, 0.2, total_iters=EPOCHS * -(-MICRO_PER_EPOCH // K))

    def loss_sum(self, chosen, rejected, resp):
        pc, pr = seq_logps(self.policy, chosen, resp), seq_logps(self.policy, rejected, resp)
        with torch.no_grad():
            rc, rr = seq_logps(self.ref, chosen, resp), seq_logps(self.ref, rejected, resp)
        return -F.logsigmoid(BETA * ((pc - rc) - (pr - rr))).sum()

    def run_window(self, window):
        n_pairs = torch.tensor(float(sum(b[0].shape[0] for b in window)))
        dist.all_reduce(n_pairs)
        for chosen, rejected, resp in window:
            (self.loss_sum(chosen, rejected, resp) / n_pairs).backward()
        for p in self.params:
            dist.all_reduce(p.grad)  # sum: each rank already holds its share of the global mean
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(EPOCHS):
            micro = [make_micro_batch(epoch, i, self.rank) for i in range(MICRO_PER_EPOCH)]
            for s in range(0, MICRO_PER_EPOCH, K):
                self.run_window(micro[s:s + K])


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    tr = DPOTrainer(rank)
    tr.fit()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in tr.policy.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
