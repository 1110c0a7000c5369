"""HF Trainer subclass for an intent classifier over bag-of-token features, 2 ranks (torchrun),
gradient_accumulation_steps=4, plain SGD with a linear schedule, label smoothing done in
our own compute_loss."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed

SEED = 11
VOCAB, DIM, N_INTENTS = 96, 32, 6
MICRO_BS, GA = 4, 4
N_TRAIN = 256


class IntentData(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, 12), generator=g)
        self.labels = (self.ids[:, 0] * 3 + self.ids[:, 5]) % N_INTENTS

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class IntentNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.Tanh(), nn.Linear(64, N_INTENTS))

    def forward(self, input_ids, labels=None):
        return {"logits": self.mlp(self.emb(input_ids))}


class SmoothedTrainer(Trainer):
    # our compute_loss returns a per-micro-batch mean: the Trainer divides it by GA
    loss_is_scaled_for_ga = False

    def __init__(self, *a, smoothing=0.1, **kw):
        super().__init__(*a, **kw)
        self.smoothing = smoothing

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs["logits"], labels, label_smoothing=self.smoothing)
        return (loss, outputs) if return_outputs else loss


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    args = TrainingArguments(
        output_dir="/tmp/a_b01_out",
        per_device_train_batch_size=MICRO_BS,
        gradient_accumulation_steps=GA,
        num_train_epochs=2,
        learning_rate=0.2,
        optim="sgd",
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.0,
        max_grad_norm=0.0,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=4,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = SmoothedTrainer(model=IntentNet(), args=args, train_dataset=IntentData(N_TRAIN, SEED))
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"global_step {trainer.state.global_step}")
        print(f"FINAL_SHA256 {params_sha(trainer.model)}")


if __name__ == "__main__":
    main()
