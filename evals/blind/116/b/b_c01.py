"""Answer-only SFT with the stock HF Trainer and a custom `compute_loss_func`.

Loss: per-token cross entropy with a confidence penalty, summed over answer
tokens and divided by `num_items_in_batch` (the Trainer's count of answer tokens
over the whole accumulation window and all ranks).  A callback records the
gradient norm the optimizer sees at every update (after the 0.5 clip).
"""
import hashlib

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

VOCAB = 72


class QADataset(Dataset):
    def __init__(self, n=20, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            q_len = int(torch.randint(3, 12, (1,), generator=g))
            a_len = int(torch.randint(2, 8, (1,), generator=g))
            q = torch.randint(4, VOCAB, (q_len,), generator=g)
            a = (q[:a_len] * 2 + 1) % VOCAB if a_len <= q_len else torch.randint(4, VOCAB, (a_len,), generator=g)
            self.rows.append((q, a))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        q, a = self.rows[i]
        ids = torch.cat([torch.tensor([1]), q, torch.tensor([2]), a, torch.tensor([3])])
        labels = ids.clone()
        labels[: len(q) + 2] = -100
        return {"input_ids": ids, "labels": labels}


def pad_collate(rows):
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    att = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        L = len(r["input_ids"])
        ids[i, :L] = r["input_ids"]
        lab[i, :L] = r["labels"]
        att[i, :L] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def confidence_penalised_ce(outputs, labels, num_items_in_batch=None, beta=0.1):
    logits = outputs.logits[:, :-1].float()
    target = labels[:, 1:]
    mask = target.ne(-100)
    logp = F.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    per_tok = (nll - beta * ent) * mask
    return per_tok.sum() / num_items_in_batch


class GradNormRecorder(TrainerCallback):
    def __init__(self):
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        sq = sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
        self.norms.append(sq ** 0.5)


def main():
    set_seed(21)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.1)
    model = LlamaForCausalLM(cfg)
    rec = GradNormRecorder()
    args = TrainingArguments(
        output_dir="tmp_scratch/b_c01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,        # 5 micro-batches per rank per epoch: windows 2-2-1
        num_train_epochs=4,
        learning_rate=2e-3,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=2,
        max_grad_norm=0.5,
        average_tokens_across_devices=True,
        save_strategy="no",
        logging_steps=100,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=21,
    )
    trainer = Trainer(model=model, args=args, train_dataset=QADataset(),
                      data_collator=pad_collate, compute_loss_func=confidence_penalised_ce,
                      callbacks=[rec])
    trainer.train()

    if trainer.is_world_process_zero():
        print("update grad norms:", " ".join(f"{n:.2f}" for n in rec.norms))
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
