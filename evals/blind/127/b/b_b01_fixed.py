"""Bi-encoder (query / passage) retrieval fine-tuning with a Trainer subclass.

In-batch negatives: every query in a micro-batch is scored against every passage of
that micro-batch; the loss is the mean InfoNCE over the micro-batch's queries.
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed

RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=200)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--q_len", type=int, default=8)
    p.add_argument("--p_len", type=int, default=16)
    p.add_argument("--pairs", type=int, default=128)       # 64 per rank
    p.add_argument("--batch", type=int, default=8)         # 8 micro-batches per rank
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class PairData(Dataset):
    def __init__(self, a):
        g = torch.Generator().manual_seed(a.seed)
        self.q = torch.randint(1, a.vocab, (a.pairs, a.q_len), generator=g)
        # passages share a few tokens with their query
        self.p = torch.randint(1, a.vocab, (a.pairs, a.p_len), generator=g)
        self.p[:, : a.q_len // 2] = self.q[:, : a.q_len // 2]

    def __len__(self):
        return len(self.q)

    def __getitem__(self, i):
        return {"query_ids": self.q[i], "passage_ids": self.p[i]}


class BiEncoder(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.dim)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(a.dim, 4, 2 * a.dim, dropout=0.0, batch_first=True), 2)
        self.proj = nn.Linear(a.dim, a.dim)

    def encode(self, ids):
        h = self.enc(self.emb(ids))
        return F.normalize(self.proj(h.mean(1)), dim=-1)

    def forward(self, query_ids, passage_ids):
        return self.encode(query_ids), self.encode(passage_ids)


class RetrievalTrainer(Trainer):
    def __init__(self, *args, temperature=0.05, **kwargs):
        super().__init__(*args, **kwargs)
        self.temperature = temperature

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, p = model(query_ids=inputs["query_ids"], passage_ids=inputs["passage_ids"])
        scores = q @ p.T / self.temperature
        target = torch.arange(q.size(0), device=q.device)
        loss = F.cross_entropy(scores, target)
        return (loss, {"scores": scores}) if return_outputs else loss


def main():
    a = get_args()
    set_seed(a.seed)
    model = BiEncoder(a)
    targs = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", "out_" + RUN_NAME),
        per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=a.grad_accum,
        num_train_epochs=a.epochs,
        learning_rate=a.lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.0,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        seed=a.seed,
        disable_tqdm=True,
    )
    trainer = RetrievalTrainer(model=model, args=targs, train_dataset=PairData(a),
                               temperature=a.temperature)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, prm in trainer.model.named_parameters():
            h.update(prm.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"world_size={trainer.args.world_size} global_step={trainer.state.global_step}", flush=True)
        torch.save({n: prm.detach().float().cpu() for n, prm in trainer.model.named_parameters()},
                   os.path.join("tmp_scratch", RUN_NAME + ".params.pt"))
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
