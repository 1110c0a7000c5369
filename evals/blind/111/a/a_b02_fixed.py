"""Bradley-Terry reward model trained with a hand-written RewardTrainer on the HF Trainer.

Pairs are bucketed by length before sharding: every rank reads its own length bucket
with a token budget per micro-batch (long pairs -> fewer pairs per micro-batch), so the
padding waste stays low. Loss: -log sigmoid(r_chosen - r_rejected), averaged over pairs.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaModel, Trainer, TrainingArguments

TOKEN_BUDGET = 60
MICRO_BATCHES_PER_EPOCH = 8  # identical on every rank so DDP stays in lockstep
GRAD_ACCUM = 4
EPOCHS = 3
SEED = 77


class RewardModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.backbone = LlamaModel(cfg)
        self.score = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, input_ids, attention_mask):
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(1) - 1
        return self.score(h[torch.arange(h.size(0)), last]).squeeze(-1)


def make_pairs(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        L = int(torch.randint(4, 13, (1,), generator=g))
        prompt = torch.randint(3, vocab, (L,), generator=g)
        good = torch.cat([prompt, prompt[:2].sort().values])
        bad = torch.cat([prompt, torch.randint(3, vocab, (2,), generator=g)])
        pairs.append((good, bad))
    return pairs


class PairSet(Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        c, r = self.pairs[i]
        return {"chosen": c, "rejected": r}


def pad_pairs(batch):
    seqs = [b["chosen"] for b in batch] + [b["rejected"] for b in batch]
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    att = torch.zeros(len(seqs), n, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        att[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": att, "n_pairs": torch.tensor(len(batch))}


class RewardTrainer(Trainer):
    def get_train_dataloader(self):
        # length-bucketed sharding: rank r reads bucket r, micro-batch size from the token budget
        rank, world = self.args.process_index, self.args.world_size
        order = sorted(range(len(self.train_dataset)), key=lambda i: len(self.train_dataset[i]["chosen"]))
        per_rank = len(order) // world
        mine = order[rank * per_rank:(rank + 1) * per_rank]
        longest = max(len(self.train_dataset[i]["chosen"]) for i in mine)
        bs = max(1, TOKEN_BUDGET // longest)
        mine = mine[: MICRO_BATCHES_PER_EPOCH * bs]
        shard = torch.utils.data.Subset(self.train_dataset, mine)
        g = torch.Generator().manual_seed(self.args.seed + rank)
        return DataLoader(shard, batch_size=bs, shuffle=True, generator=g, collate_fn=pad_pairs, drop_last=True)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        count = torch.tensor(float(sum(int(b["n_pairs"]) for b in batches)))
        self._window_pairs = self.accelerator.reduce(count, reduction="sum")  # pairs in the window, all ranks
        self.loss_is_scaled_for_ga = True
        return batches, None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = int(inputs.pop("n_pairs"))
        rewards = model(**inputs)
        margin = rewards[:n] - rewards[n:]
        loss = -F.logsigmoid(margin).sum() * self.args.world_size / self._window_pairs
        return (loss, rewards) if return_outputs else loss


def main():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = RewardModel(cfg)
    # bucket 0 holds the short pairs, bucket 1 the long ones
    pairs = make_pairs(200, cfg.vocab_size, seed=5)
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=GRAD_ACCUM,
        num_train_epochs=EPOCHS,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        save_strategy="no",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=PairSet(pairs))
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
