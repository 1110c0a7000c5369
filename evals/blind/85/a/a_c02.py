"""Lightning Fabric DPO on a tiny causal LM (frozen reference copy), DDP on 2 processes,
bf16-mixed autocast, gradient accumulation over K=2 micro-batches, the pair loss averaged
over all pairs of the window on all ranks (an epoch ends in a short window), clipping at the
boundary."""
import copy
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from lightning_fabric import Fabric, seed_everything

VOCAB, D, T = 40, 32, 10
K = 2
BETA = 0.2


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.prompt = torch.randint(0, VOCAB, (n, 4), generator=g)
        self.chosen = torch.randint(0, VOCAB // 2, (n, T - 4), generator=g)
        self.rejected = torch.randint(VOCAB // 2, VOCAB, (n, T - 4), generator=g)

    def __len__(self):
        return len(self.prompt)

    def __getitem__(self, i):
        return self.prompt[i], self.chosen[i], self.rejected[i]


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = torch.cumsum(h, dim=1) / torch.arange(1, ids.shape[1] + 1, device=ids.device)[None, :, None]
        return self.head(torch.tanh(self.mix(h)))


def seq_logp(model, prompt, completion):
    ids = torch.cat([prompt, completion], dim=1)
    logits = model(ids)[:, prompt.shape[1] - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion[..., None]).squeeze(-1).sum(-1)


def dpo_terms(policy, ref, batch):
    prompt, ch, rj = batch
    with torch.no_grad():
        ref_margin = seq_logp(ref, prompt, ch) - seq_logp(ref, prompt, rj)
    margin = seq_logp(policy, prompt, ch) - seq_logp(policy, prompt, rj)
    return -F.logsigmoid(BETA * (margin - ref_margin))


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    seed_everything(21)
    torch.use_deterministic_algorithms(True)

    policy = TinyLM()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=5e-3, weight_decay=0.0)
    policy, opt = fabric.setup(policy, opt)
    ref = fabric.to_device(ref)
    loader = fabric.setup_dataloaders(DataLoader(Pairs(26, 21), batch_size=3, shuffle=False))

    for epoch in range(3):
        it = iter(loader)
        while True:
            window = []
            for _ in range(K):
                b = next(it, None)
                if b is None:
                    break
                window.append(b)
            if not window:
                break
            n_pairs = torch.tensor(float(sum(b[0].shape[0] for b in window)))
            n_global = fabric.all_reduce(n_pairs, reduce_op="sum")
            for j, b in enumerate(window):
                last = j == len(window) - 1
                with fabric.no_backward_sync(policy, enabled=not last):
                    loss = dpo_terms(policy, ref, b).sum() * fabric.world_size / n_global
                    fabric.backward(loss)
            fabric.clip_gradients(policy, opt, max_norm=1.0)
            opt.step()
            opt.zero_grad()
        fabric.print(f"epoch {epoch} last micro loss {loss.item():.5f}")

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha(policy.module if hasattr(policy, 'module') else policy)}")


if __name__ == "__main__":
    main()
