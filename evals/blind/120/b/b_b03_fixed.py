"""Completion-only SFT on PEFT LoRA with a Trainer subclass that counts the supervised tokens itself.

The collator marks prompt tokens with -100 and also pads labels with -100; the subclass only counts
the completion tokens after the shift that the causal-LM loss applies.
"""
import hashlib, os, tempfile
from dataclasses import dataclass
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from peft import LoraConfig, get_peft_model


@dataclass
class RunConfig:
    vocab: int = 96
    micro_bs: int = 2
    grad_accum: int = 2
    lr: float = 5e-3
    epochs: int = 2
    n_rows: int = 40
    seed: int = 99


class Completions(torch.utils.data.Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_rows):
            L = int(torch.randint(5, 24, (1,), generator=g))
            ids = torch.randint(3, cfg.vocab, (L,), generator=g)
            p = int(torch.randint(1, L - 2, (1,), generator=g))
            lab = ids.clone(); lab[:p] = -100
            self.rows.append({"input_ids": ids, "labels": lab})
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]


def pad_collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long); lab = torch.full((len(rows), L), -100); att = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"]); ids[i, :n] = r["input_ids"]; lab[i, :n] = r["labels"]; att[i, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


class CompletionTrainer(Trainer):
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples = []
        for _ in range(num_batches):
            try:
                batch_samples.append(next(epoch_iterator))
            except StopIteration:
                break
        if not batch_samples:
            return batch_samples, None
        # supervised tokens after the causal shift, over the whole accumulation window
        num_items = sum(b["labels"][..., 1:].ne(-100).sum() for b in batch_samples).to(device)
        if self.args.world_size > 1:
            num_items = self.accelerator.gather(num_items).sum()
        return batch_samples, num_items


def main():
    rc = RunConfig()
    torch.manual_seed(0)
    mcfg = LlamaConfig(vocab_size=rc.vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(mcfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "b120b_b03_out"),
        per_device_train_batch_size=rc.micro_bs, gradient_accumulation_steps=rc.grad_accum,
        learning_rate=rc.lr, num_train_epochs=rc.epochs, lr_scheduler_type="constant",
        max_grad_norm=0.0, seed=rc.seed, report_to=[], save_strategy="no", logging_steps=1000,
        disable_tqdm=True, use_cpu=True, ddp_backend="gloo",
    )
    trainer = CompletionTrainer(model=model, args=args, train_dataset=Completions(rc), data_collator=pad_collate)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
