"""SFT on a tiny Llama with the HF Trainer plus a logit-confidence penalty.

The penalty (mean squared log-partition of the logits) keeps the head calibrated.
It is a per-micro-batch mean, so we tell the Trainer the returned loss is *not*
already scaled for gradient accumulation and let it divide by the window size.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 16
    n_rows: int = 48
    per_device_bs: int = 2
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    penalty_weight: float = 0.05
    seed: int = 1234


def make_rows(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for _ in range(cfg.n_rows):
        n = int(torch.randint(5, cfg.seq_len + 1, (1,), generator=g))
        ids = torch.randint(3, cfg.vocab, (cfg.seq_len,), generator=g)
        ids[n:] = 0
        labels = ids.clone()
        labels[n:] = -100
        labels[:2] = -100  # prompt tokens
        mask = torch.zeros(cfg.seq_len, dtype=torch.long)
        mask[:n] = 1
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


class CalibratedSFTTrainer(Trainer):
    def __init__(self, *a, penalty_weight=0.0, **kw):
        super().__init__(*a, **kw)
        self.penalty_weight = penalty_weight

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        mask = inputs["attention_mask"].bool()
        lse = torch.logsumexp(outputs.logits.float(), dim=-1)[mask]
        penalty = (lse ** 2).mean()
        loss = lm_loss + self.penalty_weight * penalty / self.current_gradient_accumulation_steps
        return (loss, outputs) if return_outputs else loss


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    mcfg = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    model = LlamaForCausalLM(mcfg)
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "b02_out"),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=0.0,
        weight_decay=0.0,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        report_to=[],
        logging_steps=1000,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = CalibratedSFTTrainer(
        model=model, args=args, train_dataset=make_rows(cfg), penalty_weight=cfg.penalty_weight
    )
    trainer.train()
    h = hashlib.sha256()
    for _, p in trainer.model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if trainer.args.process_index == 0:
        if os.environ.get("B_DUMP"):
            torch.save({n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}, os.environ["B_DUMP"])
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
