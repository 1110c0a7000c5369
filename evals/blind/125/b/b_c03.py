"""Logit distillation with a Trainer subclass: a frozen teacher held by the trainer (outside DDP),
the student's CE over the Trainer's `num_items_in_batch` plus a per-token KL over the same count,
x world size (DDP averages), windows of 2-2-1 (5 micro-batches per rank per epoch, K = 2), clip 0.5."""
import hashlib
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

SEED = 3
VOCAB = 64
SEQ = 12


def tiny(layers, hidden):
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0))


class Text(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED + 1)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(4, SEQ + 1, (1,), generator=g))
            ids = torch.zeros(SEQ, dtype=torch.long)
            ids[:L] = torch.randint(2, VOCAB, (L,), generator=g)
            att = (ids != 0).long()
            lab = ids.masked_fill(att == 0, -100)
            self.items.append({"input_ids": ids, "attention_mask": att, "labels": lab})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class DistillTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def __init__(self, *a, teacher=None, alpha=0.5, temperature=2.0, **kw):
        super().__init__(*a, **kw)
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.alpha, self.temperature = alpha, temperature

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs, num_items_in_batch=num_items_in_batch)   # sum CE / window count
        with torch.no_grad():
            t_logits = self.teacher(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        T = self.temperature
        s = F.log_softmax(out.logits[:, :-1].float() / T, dim=-1)
        t = F.log_softmax(t_logits[:, :-1].float() / T, dim=-1)
        mask = (inputs["labels"][:, 1:] != -100).float()
        kl_tok = (t.exp() * (t - s)).sum(-1)
        kd = (kl_tok * mask).sum() / num_items_in_batch * T * T
        loss = (1 - self.alpha) * out.loss + self.alpha * kd
        loss = loss * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    set_seed(SEED)
    teacher = tiny(3, 48)
    student = tiny(1, 32)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c03_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=4e-3,
        lr_scheduler_type="linear",
        max_grad_norm=0.5,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = DistillTrainer(model=student, args=args, train_dataset=Text(20), teacher=teacher)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"optimizer steps: {trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
