"""HF Trainer subclass: token tagging with a frozen embedding table, partially masked labels
(uneven valid-token counts) normalised over the window's token count via num_items_in_batch,
its own two-group optimizer, a clip that acts; K=3 on 2 ranks."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

VOCAB, TAGS, SEQ = 50, 7, 12
SEED = 31


class TaggingSet(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        tags = (self.ids * 3 + torch.roll(self.ids, 1, dims=1)) % TAGS
        keep = torch.rand(n, SEQ, generator=g) < torch.linspace(0.2, 0.9, n).unsqueeze(1)
        keep[:, 0] = True
        self.labels = torch.where(keep, tags, torch.full_like(tags, -100))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 24)
        self.embed.weight.requires_grad_(False)  # pretrained table kept frozen
        self.mix = nn.Conv1d(24, 48, kernel_size=3, padding=1)
        self.out = nn.Linear(48, TAGS)

    def forward(self, input_ids, labels=None, num_items_in_batch=None, **kwargs):
        h = self.embed(input_ids).transpose(1, 2)
        h = F.gelu(self.mix(h)).transpose(1, 2)
        logits = self.out(h)
        loss = None
        if labels is not None:
            total = F.cross_entropy(logits.reshape(-1, TAGS), labels.reshape(-1), ignore_index=-100, reduction="sum")
            denom = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
            loss = total / denom
        return {"loss": loss, "logits": logits}


class TwoGroupTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if n.endswith("bias") else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                lr=self.args.learning_rate,
            )
        return self.optimizer


class GradNormProbe(TrainerCallback):
    """Read-only: remembers the pre-clip norm of the last update."""

    def __init__(self):
        self.last = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
        self.last = torch.cat(grads).norm().item()


def main():
    set_seed(SEED)
    model = Tagger()
    ds = TaggingSet(240, SEED)  # 2 ranks x 4 x K=3 -> 24 per update, 10 updates per epoch
    args = TrainingArguments(
        output_dir="/tmp/blind90_a_c01_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=4e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.3,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=True,
        remove_unused_columns=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = TwoGroupTrainer(model=model, args=args, train_dataset=ds, callbacks=[GradNormProbe()])
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
