"""HF Trainer + PEFT LoRA on a tiny GPT-2 with prompt-masked labels, an overridden create_optimizer
(separate LR for the LoRA B matrices), clipping at 0.5, and an epoch whose last window is short
(11 micro-batches per rank with gradient_accumulation_steps=4)."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
from peft import LoraConfig, get_peft_model

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ = 80, 20


class MaskedSFT(Dataset):
    def __init__(self, n=88, seed=21):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
            cut = int(torch.randint(3, SEQ - 2, (1,), generator=g))
            labels = ids.clone()
            labels[:cut] = -100
            self.items.append({"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long),
                               "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class LoraPlusTrainer(Trainer):
    """LoRA+-style: the B matrices get a larger learning rate than the A matrices."""

    lora_b_ratio = 4.0

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            groups = [
                {"params": [p for n, p in named if "lora_B" not in n], "lr": self.args.learning_rate},
                {"params": [p for n, p in named if "lora_B" in n], "lr": self.args.learning_rate * self.lora_b_ratio},
            ]
            self.optimizer = torch.optim.AdamW(groups, weight_decay=self.args.weight_decay)
        return self.optimizer


def main():
    set_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, fan_in_fan_out=True,
                                            target_modules=["c_attn", "c_fc"], task_type="CAUSAL_LM"))
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_a_c03"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=3,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        weight_decay=0.01,
        max_grad_norm=0.5,
        seed=0,
        data_seed=0,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = LoraPlusTrainer(model=model, args=args, train_dataset=MaskedSFT())
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
