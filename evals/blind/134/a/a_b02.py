"""DeepSpeed ZeRO-2 token-level LM trainer; windows read ahead so each window is normalised by its token count."""
import hashlib
import itertools
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB = 64
SEQ = 24
PAD = 0
IGNORE = -100

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,
                          "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10_000,
    "wall_clock_breakdown": False,
}


class RaggedLM(Dataset):
    """Sequences of very different lengths, right-padded; labels are -100 on padding."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            length = int(torch.randint(3, SEQ + 1, (1,), generator=g))
            if i % 2 == 1:  # odd indices (rank 1 under the sampler) hold short sequences
                length = max(3, length // 3)
            ids = torch.randint(1, VOCAB, (length,), generator=g)
            self.items.append(ids)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids = self.items[i]
        inp = torch.full((SEQ,), PAD, dtype=torch.long)
        lab = torch.full((SEQ,), IGNORE, dtype=torch.long)
        inp[: len(ids)] = ids
        lab[: len(ids) - 1] = ids[1:]
        return inp, lab


class TinyLM(nn.Module):
    def __init__(self, dim=48):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.mix = nn.Conv1d(dim, dim, kernel_size=3, padding=2)
        self.ff = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.mix(h.transpose(1, 2))[..., : ids.size(1)].transpose(1, 2)  # causal conv
        h = h + self.ff(h)
        return self.out(h)


class ZeroTrainer:
    def __init__(self, ds_config, max_updates=16, seed=11):
        self.max_updates = max_updates
        torch.manual_seed(seed)
        model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.K = self.engine.gradient_accumulation_steps()
        ds = RaggedLM(self.world * ds_config["train_micro_batch_size_per_gpu"] * self.K * max_updates, seed)
        sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=False)
        self.loader = DataLoader(ds, batch_size=self.engine.train_micro_batch_size_per_gpu(), sampler=sampler)

    def window_token_count(self, window):
        n_tok = sum(int((lab != IGNORE).sum()) for _, lab in window)
        return torch.tensor(float(n_tok))

    def train(self):
        it = iter(self.loader)
        updates = 0
        while updates < self.max_updates:
            window = list(itertools.islice(it, self.K))
            if len(window) < self.K:
                break
            n_tok = self.window_token_count(window)
            for inp, lab in window:
                logits = self.engine(inp)
                tok_loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), lab.reshape(-1),
                                               ignore_index=IGNORE, reduction="sum")
                # engine.backward divides by K and the ranks' gradients are averaged
                loss = tok_loss_sum * self.K / n_tok
                self.engine.backward(loss)
                self.engine.step()
            updates += 1
        return updates

    def digest(self):
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in self.engine.module.named_parameters()])
        dump = os.environ.get("DUMP_DIR")
        if dump and self.rank == 0:
            torch.save(flat, os.path.join(dump, os.path.basename(__file__) + ".pt"))
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    trainer = ZeroTrainer(DS_CONFIG)
    updates = trainer.train()
    digest = trainer.digest()
    if trainer.rank == 0:
        print(f"updates={updates} engine_steps={trainer.engine.global_steps}")
        print(f"FINAL_SHA256 {digest}")


if __name__ == "__main__":
    main()
