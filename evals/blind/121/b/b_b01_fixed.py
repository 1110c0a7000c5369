"""Intent classifier fine-tune with a focal loss (HF Trainer subclass).

Tiny Llama sequence classifier from a random config, synthetic data.
Large batch = per_device_bs x grad_accum x world_size sequences per update.
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_LABELS = 5
SEQ_LEN = 16
VOCAB = 128


class SyntheticIntents(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, VOCAB, (n, SEQ_LEN), generator=g)
        lengths = torch.randint(6, SEQ_LEN + 1, (n,), generator=g)
        self.mask = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
        self.ids = self.ids * self.mask  # pad id 0
        self.labels = (self.ids[:, 1] + self.ids[:, 2]) % NUM_LABELS

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def focal_loss(logits, target, gamma=2.0):
    logp = F.log_softmax(logits.float(), dim=-1)
    logp_t = logp.gather(-1, target[:, None]).squeeze(-1)
    p_t = logp_t.exp()
    per_example = -((1.0 - p_t) ** gamma) * logp_t
    # normalised by the number of examples in the batch
    return per_example.sum() / target.numel()


class FocalTrainer(Trainer):
    # our compute_loss returns a per-micro-batch mean: let the Trainer divide by the GA steps
    loss_is_scaled_for_ga = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = focal_loss(outputs.logits, labels)
        return (loss, outputs) if return_outputs else loss


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(1234)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_labels=NUM_LABELS, pad_token_id=0,
    )
    model = LlamaForSequenceClassification(cfg)

    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_b01"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=0.05,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        seed=1234,
        data_seed=1234,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = FocalTrainer(model=model, args=args, train_dataset=SyntheticIntents(192, seed=7))
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"optimizer steps: {trainer.state.global_step}")
        print(f"FINAL_SHA256 {param_sha(trainer.model)}")


if __name__ == "__main__":
    main()
