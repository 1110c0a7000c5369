"""ZeRO-2 trainer for a small tagging model (per-token classification).

DeepSpeed owns gradient accumulation (gradient_accumulation_steps in the
config); the trainer keeps its own global_step for logging and eval.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--vocab", type=int, default=80)
    p.add_argument("--tags", type=int, default=7)
    p.add_argument("--hidden", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=12)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--seed", type=int, default=777)
    return p.parse_args()


class Tagger(nn.Module):
    def __init__(self, vocab, hidden, tags):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mix = nn.Conv1d(hidden, hidden, kernel_size=3, padding=1)
        self.proj = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, tags)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + torch.tanh(self.mix(h.transpose(1, 2))).transpose(1, 2)
        h = F.gelu(self.proj(h))
        return self.out(h)


def build_ds_config(args):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class Trainer:
    def __init__(self, args):
        self.args = args
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(args.seed)
        model = Tagger(args.vocab, args.hidden, args.tags)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                    config=build_ds_config(args))
        self.global_step = 0

    def batches(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed + 1)
        n = a.max_steps * a.grad_accum * self.world
        ids = torch.randint(0, a.vocab, (n, a.micro_batch, a.seq_len), generator=g)
        tags = (ids + torch.roll(ids, 1, dims=-1)) % a.tags
        for i in range(self.rank, n, self.world):
            yield ids[i], tags[i]

    def training_step(self, ids, tags):
        logits = self.engine(ids)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))

    def train(self):
        for ids, tags in self.batches():
            loss = self.training_step(ids, tags)
            self.engine.backward(loss)
            boundary = self.engine.is_gradient_accumulation_boundary()
            self.engine.step()
            if boundary:
                self.global_step += 1
                if self.rank == 0 and self.global_step % self.args.log_every == 0:
                    print(f"step {self.global_step} loss {loss.item():.4f}")
        if self.rank == 0:
            print(f"done after {self.global_step} optimizer steps")

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    trainer = Trainer(args)
    trainer.train()
    sha = trainer.final_sha()
    if trainer.rank == 0:
        print("FINAL_SHA256", sha)


if __name__ == "__main__":
    main()
