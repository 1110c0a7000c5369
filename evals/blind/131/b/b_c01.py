"""Instruction tuning with a Trainer subclass: answer tokens only, summed over the
window's answer-token count, a frozen token embedding, two parameter groups for
the optimizer, a clip that acts, and an epoch of 8 micro-batches (windows 3-3-2)."""
import hashlib

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB = 64
PAD = 0


class QA(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            lp = int(torch.randint(2, 9, (1,), generator=g))
            la = int(torch.randint(1, 8, (1,), generator=g))
            q = torch.randint(3, VOCAB, (lp,), generator=g)
            a = (q[:la] * 5 + 7) % (VOCAB - 3) + 3 if la <= lp else torch.randint(3, VOCAB, (la,), generator=g)
            self.rows.append((q, a))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        q, a = self.rows[i]
        ids = torch.cat([torch.tensor([1]), q, a, torch.tensor([2])])
        labels = ids.clone()
        labels[: 1 + len(q)] = -100
        return {"input_ids": ids, "labels": labels}


def pad_collate(rows):
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), n), PAD)
    lab = torch.full((len(rows), n), -100)
    att = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        L = len(r["input_ids"])
        ids[i, :L] = r["input_ids"]
        lab[i, :L] = r["labels"]
        att[i, :L] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


class AnswerOnlyTrainer(Trainer):
    # our loss is already normalised over the whole accumulated batch
    loss_is_scaled_for_ga = True

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if p.ndim == 1 else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.05, "lr": self.args.learning_rate},
                 {"params": no_decay, "weight_decay": 0.0, "lr": self.args.learning_rate * 0.5}],
                betas=(0.9, 0.95))
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].float()
        tgt = labels[:, 1:]
        tok_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                  ignore_index=-100, reduction="sum")
        # num_items_in_batch: answer tokens of the whole window on all ranks;
        # DDP averages over ranks, so scale back by the world size
        loss = tok_sum / num_items_in_batch * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(77)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.1, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)

    args = TrainingArguments(
        output_dir="tmp_scratch/c01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=3,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.5,
        average_tokens_across_devices=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        seed=77,
        data_seed=77,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = AnswerOnlyTrainer(model=model, args=args, train_dataset=QA(32, seed=5), data_collator=pad_collate)
    trainer.train()
    if trainer.is_world_process_zero():
        print("steps", trainer.state.global_step,
              "grad norms", [round(h["grad_norm"], 3) for h in trainer.state.log_history if "grad_norm" in h])
        print("FINAL_SHA256", final_sha(trainer.model), flush=True)


if __name__ == "__main__":
    main()
