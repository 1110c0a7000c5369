# Intent classifier fine-tuning, adapted from the HF `run_glue_no_trainer.py` example.
import hashlib
import math
import os
from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

args = SimpleNamespace(
    seed=42, num_labels=5, vocab=120, seq_len=14, n_train=40,
    per_device_train_batch_size=2, gradient_accumulation_steps=4,
    num_train_epochs=3, learning_rate=1e-3, num_warmup_steps=1,
)


class IntentDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, args.vocab, (n, args.seq_len), generator=g)
        self.labels = (self.ids[:, :3].sum(1) % args.num_labels)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2
    set_seed(args.seed)
    config = BertConfig(vocab_size=args.vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=args.num_labels,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    train_dataloader = DataLoader(IntentDataset(args.n_train, args.seed), shuffle=True,
                                  batch_size=args.per_device_train_batch_size,
                                  generator=torch.Generator().manual_seed(args.seed))
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)

    K = args.gradient_accumulation_steps
    n_batches = len(train_dataloader)
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                # Accelerate divides by K; the epoch's last window may hold fewer batches
                window_len = min(K, n_batches - (step // K) * K)
                accelerator.backward(outputs.loss * K / window_len)
                if accelerator.sync_gradients:
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()

    unwrapped = accelerator.unwrap_model(model)
    h = hashlib.sha256()
    for _, p in unwrapped.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if accelerator.is_main_process:
        if os.environ.get("B_DUMP"):
            torch.save({n: p.detach().float().cpu() for n, p in unwrapped.named_parameters()}, os.environ["B_DUMP"])
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
