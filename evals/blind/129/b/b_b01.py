"""LoRA SFT with the HF Trainer plus an orthogonality regulariser on the LoRA A matrices.

The regulariser depends only on the weights, so it is added once per optimizer step (on the
first micro-batch of each accumulation window) instead of once per micro-batch.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, SEQ, N_SAMPLES = 96, 24, 20
HERE = os.path.dirname(os.path.abspath(__file__))


class ToySFT(Dataset):
    """Prompt + answer rows; only the answer is supervised. Lengths vary."""

    def __init__(self, n, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = int(torch.randint(4, 9, (1,), generator=g))
            a = int(torch.randint(3, SEQ - p + 1, (1,), generator=g))
            ids = torch.randint(3, VOCAB, (p + a,), generator=g)
            self.rows.append((ids, p))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, p = self.rows[i]
        return {"ids": ids, "prompt_len": p}


def collate(rows):
    longest = max(len(r["ids"]) for r in rows)
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long)
    attn = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for j, r in enumerate(rows):
        n = len(r["ids"])
        input_ids[j, :n] = r["ids"]
        attn[j, :n] = 1
        labels[j, r["prompt_len"]:n] = r["ids"][r["prompt_len"]:]
    return {"input_ids": input_ids, "attention_mask": attn, "labels": labels}


def lora_orthogonality(model):
    pen = 0.0
    for name, p in model.named_parameters():
        if "lora_A" in name and p.requires_grad:
            gram = p @ p.t()
            pen = pen + ((gram - torch.eye(gram.shape[0])) ** 2).sum()
    return pen


class OrthoLoRATrainer(Trainer):
    def __init__(self, *args, ortho_weight=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.ortho_weight = ortho_weight
        self._micro_step = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        res = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                   num_items_in_batch=num_items_in_batch)
        loss, outputs = (res if return_outputs else (res, None))
        if model.training:
            # weight-only term: once per optimizer step, on the window's first micro-batch
            if self._micro_step % self.args.gradient_accumulation_steps == 0:
                loss = loss + self.ortho_weight * lora_orthogonality(model)
            self._micro_step += 1
        return (loss, outputs) if return_outputs else loss


def main():
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))

    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "b01_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=4,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        save_strategy="no",
        logging_steps=100,
        report_to=[],
        seed=0,
        data_seed=0,
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    trainer = OrthoLoRATrainer(model=model, args=args, train_dataset=ToySFT(N_SAMPLES),
                               data_collator=collate, ortho_weight=0.5)
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
