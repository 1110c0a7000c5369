# Token-level knowledge distillation with a Trainer subclass: a frozen teacher lives on the
# trainer (never wrapped, never optimised), the student has a frozen embedding table and uses
# gradient checkpointing. The loss is a sum over the answer tokens normalised by the Trainer's
# `num_items_in_batch` (the window's answer tokens over all ranks).
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


@dataclass
class DistillArgs:
    seed: int = 3
    vocab: int = 100
    k: int = 3
    per_device: int = 2
    samples: int = 32  # 16 per rank -> 8 micro-batches per epoch -> windows of 3, 3, 2
    epochs: int = 2
    alpha: float = 0.5
    temperature: float = 2.0


class SkewedLengths(Dataset):
    def __init__(self, a: DistillArgs):
        g = torch.Generator().manual_seed(a.seed)
        self.items = []
        for _ in range(a.samples):
            n = int(torch.randint(6, 20, (1,), generator=g))
            ids = torch.randint(1, a.vocab, (n,), generator=g)
            labels = ids.clone()
            labels[: int(torch.randint(2, n - 2, (1,), generator=g))] = -100
            self.items.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(rows):
    w = max(len(r["input_ids"]) for r in rows)
    out = {"input_ids": torch.zeros(len(rows), w, dtype=torch.long),
           "labels": torch.full((len(rows), w), -100, dtype=torch.long),
           "attention_mask": torch.zeros(len(rows), w, dtype=torch.long)}
    for j, r in enumerate(rows):
        n = len(r["input_ids"])
        out["input_ids"][j, :n] = r["input_ids"]
        out["labels"][j, :n] = r["labels"]
        out["attention_mask"][j, :n] = 1
    return out


class DistillTrainer(Trainer):
    # our compute_loss already divides by the window's token count: no extra / K
    loss_is_scaled_for_ga = True

    def __init__(self, *args, teacher, distill: DistillArgs, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher.eval().requires_grad_(False)
        self.distill = distill

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        with torch.no_grad():
            t_logits = self.teacher(**inputs).logits
        s = out.logits[:, :-1]
        t = t_logits[:, :-1]
        tgt = labels[:, 1:]
        mask = tgt.ne(-100)
        T = self.distill.temperature
        kd = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True, reduction="none").sum(-1)
        ce = F.cross_entropy(s.transpose(1, 2), tgt.clamp_min(0), reduction="none")
        per_tok = self.distill.alpha * (T * T) * kd + (1 - self.distill.alpha) * ce
        total = (per_tok * mask).sum()
        # num_items_in_batch is summed over all ranks; DDP averages over ranks, so scale by W
        loss = total / num_items_in_batch * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss


def tiny_llama(a, layers, hidden, seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=a.vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=32, use_cache=False))


def main():
    a = DistillArgs()
    set_seed(a.seed)
    teacher = tiny_llama(a, layers=3, hidden=64, seed=a.seed + 100)
    student = tiny_llama(a, layers=2, hidden=32, seed=a.seed)
    student.model.embed_tokens.weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c03_out"),
        per_device_train_batch_size=a.per_device, gradient_accumulation_steps=a.k, num_train_epochs=a.epochs,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=1, weight_decay=0.01, max_grad_norm=1.0,
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        seed=a.seed, data_seed=a.seed, use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        logging_steps=2, disable_tqdm=True, remove_unused_columns=False,
    )
    trainer = DistillTrainer(model=student, args=args, train_dataset=SkewedLengths(a), data_collator=collate,
                             teacher=teacher, distill=a)
    trainer.train()

    h = hashlib.sha256()
    for _, p in trainer.model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
