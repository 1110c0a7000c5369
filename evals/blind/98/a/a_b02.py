"""Intent classification with a cosine-margin (ArcFace-style) head on a tiny BERT encoder,
trained with a Trainer subclass.

Launch: torchrun --nproc-per-node 2 a_b02.py
"""
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import BertConfig, BertModel, Trainer, TrainingArguments, set_seed

SEED = 17
NUM_CLASSES = 6
VOCAB = 80
SEQ = 12


class CosineMarginHead(nn.Module):
    """Additive angular margin head: s * cos(theta + m) for the target class."""

    def __init__(self, dim, n_classes, margin=0.2, init_scale=8.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_classes, dim) * 0.1)
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.margin = margin

    def forward(self, feats, labels):
        cos = F.linear(F.normalize(feats, dim=-1), F.normalize(self.weight, dim=-1)).clamp(-0.999, 0.999)
        target = torch.cos(torch.acos(cos) + self.margin)
        onehot = F.one_hot(labels, cos.shape[-1]).to(cos.dtype)
        logits = self.log_scale.exp() * (onehot * target + (1 - onehot) * cos)
        return F.cross_entropy(logits, labels)


class IntentData(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED + 3)
        self.labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
        self.ids = torch.randint(5, VOCAB, (n, SEQ), generator=g)
        self.ids[:, 1] = self.labels + 5  # a weak lexical cue
        self.ids[:, 0] = 2  # [CLS]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


class MetricTrainer(Trainer):
    def __init__(self, *args, metric_head=None, head_lr=5e-3, **kwargs):
        super().__init__(*args, **kwargs)
        self.metric_head = metric_head
        self.head_lr = head_lr
        # our compute_loss returns a per-micro-batch mean; let the Trainer divide by GA
        self.model_accepts_loss_kwargs = False

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            head_ids = {id(p) for p in self.metric_head.parameters()}
            body = [p for p in self.model.parameters() if p.requires_grad and id(p) not in head_ids]
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": body, "lr": self.args.learning_rate, "weight_decay": 0.01},
                    {"params": list(self.metric_head.parameters()), "lr": self.head_lr, "weight_decay": 0.0},
                ],
                betas=(0.9, 0.98),
            )
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        feats = out.last_hidden_state[:, 0]
        loss = self.metric_head(feats, labels)
        return (loss, out) if return_outputs else loss


def main():
    set_seed(SEED)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertModel(cfg, add_pooling_layer=False)
    model.embeddings.position_embeddings.weight.requires_grad_(False)
    head = CosineMarginHead(cfg.hidden_size, NUM_CLASSES)

    bs, ga, updates = 4, 3, 8
    train = IntentData(bs * ga * updates * world)
    args = TrainingArguments(
        output_dir="/tmp/a_b02_out", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=5.0, logging_steps=100, save_strategy="no", report_to="none", use_cpu=True,
        ddp_backend="gloo", ddp_find_unused_parameters=False, dataloader_num_workers=0,
        remove_unused_columns=False, seed=SEED, data_seed=SEED, disable_tqdm=True,
    )
    trainer = MetricTrainer(model=model, args=args, train_dataset=train, metric_head=head)
    trainer.train()

    named = list(model.named_parameters())
    seen = {id(p) for _, p in named}
    named += [("metric_head." + n, p) for n, p in head.named_parameters() if id(p) not in seen]
    if trainer.is_world_process_zero():
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, p in named:
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
