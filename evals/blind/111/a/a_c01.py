"""Joint intent classification + slot tagging with an HF Trainer subclass (multi-task heads).

The model returns both heads' logits; `compute_loss` combines an intent cross-entropy
with a per-utterance slot-tagging mean. Position embeddings stay frozen, the heads get their own learning rate, the
gradient is clipped at 0.1, and each epoch ends with a 2-batch window (10 batches, K 4).
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import BertConfig, BertModel, Trainer, TrainingArguments

N_INTENTS, N_TAGS, VOCAB = 5, 6, 60
SEED = 31


class IntentSlotModel(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=32)
        self.encoder = BertModel(cfg, add_pooling_layer=False)
        self.intent_head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, N_INTENTS))
        self.slot_head = nn.Linear(32, N_TAGS)

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.intent_head(hidden[:, 0]), self.slot_head(hidden)


class Utterances(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(4, 14, (1,), generator=g))
            ids = torch.randint(2, VOCAB, (L,), generator=g)
            ids[0] = 1  # [CLS]
            tags = (ids % N_TAGS)
            tags[0] = -100
            intent = int(ids[1:].sum()) % N_INTENTS
            self.rows.append((ids, tags, intent))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, tags, intent = self.rows[i]
        return {"input_ids": ids, "slot_labels": tags, "intent_labels": intent}


def collate(batch):
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.long)
    att = torch.zeros(len(batch), n, dtype=torch.long)
    tags = torch.full((len(batch), n), -100, dtype=torch.long)
    for i, b in enumerate(batch):
        L = len(b["input_ids"])
        ids[i, :L], att[i, :L], tags[i, :L] = b["input_ids"], 1, b["slot_labels"]
    return {"input_ids": ids, "attention_mask": att, "slot_labels": tags,
            "intent_labels": torch.tensor([b["intent_labels"] for b in batch])}


class MultiTaskTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            core = self.model
            heads = [p for n, p in core.named_parameters() if "head" in n and p.requires_grad]
            body = [p for n, p in core.named_parameters() if "head" not in n and p.requires_grad]
            self.optimizer = torch.optim.AdamW(
                [{"params": body, "lr": self.args.learning_rate, "weight_decay": 0.01},
                 {"params": heads, "lr": 3 * self.args.learning_rate, "weight_decay": 0.0}])
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        intents = inputs.pop("intent_labels")
        tags = inputs.pop("slot_labels")
        intent_logits, slot_logits = model(**inputs)
        intent_loss = F.cross_entropy(intent_logits, intents)
        # slot loss: each utterance's mean over its tagged tokens, then the mean over utterances
        tok = F.cross_entropy(slot_logits.transpose(1, 2), tags, ignore_index=-100, reduction="none")
        valid = (tags != -100).float()
        slot_loss = ((tok * valid).sum(1) / valid.sum(1)).mean()
        loss = intent_loss + slot_loss
        return (loss, (intent_logits, slot_logits)) if return_outputs else loss


def main():
    torch.manual_seed(SEED)
    model = IntentSlotModel()
    model.encoder.embeddings.position_embeddings.weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=0.1,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        save_strategy="no",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = MultiTaskTrainer(model=model, args=args, train_dataset=Utterances(80, seed=3), data_collator=collate)
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
