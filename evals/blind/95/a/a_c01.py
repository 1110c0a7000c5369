"""Supervised fine-tuning of a tiny Llama with a Trainer subclass.

- prompt tokens are masked out of the loss (labels -100), completions have different lengths
- the token embedding is frozen; create_optimizer builds two AdamW groups (no decay on norms/biases)
- 20 examples per rank at 2 per device and K = 4: each epoch ends in a 2-micro-batch window
- max_grad_norm = 0.5 (the clip acts), a callback records the pre-clip gradient norm
"""
import hashlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, TrainerCallback, set_seed

VOCAB = 64
PAD = 0


def make_examples(n, seed=11):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p_len = int(torch.randint(3, 7, (1,), generator=g))
        c_len = int(torch.randint(2, 9, (1,), generator=g))
        prompt = torch.randint(3, VOCAB, (p_len,), generator=g)
        completion = (prompt[-1] + torch.arange(1, c_len + 1) * 5) % (VOCAB - 3) + 3
        ids = torch.cat([torch.tensor([1]), prompt, torch.tensor([2]), completion])
        labels = ids.clone()
        labels[: p_len + 2] = -100
        rows.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return rows


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), PAD)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        labels[i, :n] = torch.tensor(f["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class GradNormRecorder(TrainerCallback):
    def __init__(self):
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        sq = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
        self.norms.append(sq ** 0.5)


class GroupedTrainer(Trainer):
    def create_optimizer(self):
        if self.optimizer is None:
            decay, no_decay = [], []
            for name, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if (p.ndim < 2 or "norm" in name) else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                lr=self.args.learning_rate, betas=(0.9, 0.98))
        return self.optimizer


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(5)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.model.embed_tokens.weight.requires_grad_(False)

    args = TrainingArguments(
        output_dir="tmp_scratch/a_c01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=0.5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=5,
        data_seed=5,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo",
    )
    recorder = GradNormRecorder()
    trainer = GroupedTrainer(model=model, args=args, train_dataset=make_examples(40), data_collator=collate,
                             callbacks=[recorder])
    trainer.train()
    if trainer.is_world_process_zero():
        print("FINAL_SHA256", sha_of(trainer.model))


if __name__ == "__main__":
    main()
