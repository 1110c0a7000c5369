"""DeepSpeed ZeRO-2 pre-training of a tiny causal LM with a batch-size ramp.

The global batch grows during training (small batches early, larger later), done the
DeepSpeed way: keep the micro-batch fixed and change the number of accumulated
micro-batches with ``engine.set_train_batch_size``.

    deepspeed --num_gpus 2 --master_port 49011 a_b02.py
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, D = 96, 16, 48


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(CTX, D) * 0.02)
        self.block = nn.TransformerEncoderLayer(D, nhead=4, dim_feedforward=2 * D, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CTX), persistent=False)

    def forward(self, idx, targets):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = self.block(h, src_mask=self.mask[: idx.shape[1], : idx.shape[1]], is_causal=True)
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro-batch-size", type=int, default=4)
    # optimizer step at which each accumulation factor starts
    p.add_argument("--accum-ramp", type=str, default="0:2,6:4")
    p.add_argument("--total-steps", type=int, default=14)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=3)
    return p.parse_args()


class RampTrainer:
    def __init__(self, args):
        self.args = args
        self.ramp = sorted((int(s), int(k)) for s, k in (kv.split(":") for kv in args.accum_ramp.split(",")))
        torch.manual_seed(args.seed)
        model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch_size,
            "gradient_accumulation_steps": self.ramp[0][1],
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
            "steps_per_print": 10_000,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        self.rank = dist.get_rank()
        self.current_k = None

    def accum_for_step(self, step):
        k = self.ramp[0][1]
        for start, kk in self.ramp:
            if step >= start:
                k = kk
        return k

    def apply_ramp(self, step):
        k = self.accum_for_step(step)
        if k != self.current_k:
            # global batch = micro-batch x accumulation steps
            self.engine.set_train_batch_size(self.args.micro_batch_size * k)
            self.current_k = k
            if self.rank == 0:
                print(f"step {step}: accumulation -> {k} "
                      f"(engine GA {self.engine.gradient_accumulation_steps()})", flush=True)
        return k

    def batches(self):
        g = torch.Generator().manual_seed(1000 + self.rank)
        # a noisy repeating grammar so that the loss actually goes down
        base = torch.arange(CTX + 1)
        while True:
            start = torch.randint(0, VOCAB, (self.args.micro_batch_size, 1), generator=g)
            stride = torch.randint(1, 5, (self.args.micro_batch_size, 1), generator=g)
            seq = (start + stride * base) % VOCAB
            noise = torch.rand(seq.shape, generator=g) < 0.1
            seq = torch.where(noise, torch.randint(0, VOCAB, seq.shape, generator=g), seq)
            yield seq[:, :-1], seq[:, 1:]

    def train(self):
        it = self.batches()
        for step in range(self.args.total_steps):
            k = self.apply_ramp(step)
            for _ in range(k):
                x, y = next(it)
                loss = self.engine(x, y)
                self.engine.backward(loss)
                self.engine.step()
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss.item():.4f} engine steps {self.engine.global_steps}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.set_num_threads(1)
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = RampTrainer(args)
    trainer.train()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)


if __name__ == "__main__":
    main()
