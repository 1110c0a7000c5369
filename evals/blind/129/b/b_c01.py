"""Stock HF Trainer on a PEFT LoRA adapter, interrupted and resumed into a brand-new Trainer.

Phase 1 trains 2 epochs and checkpoints; phase 2 builds a fresh model and Trainer and resumes
from that checkpoint for a third epoch. Epochs are 5 micro-batches per rank at K = 2
(windows 2-2-1), the clip at 0.3 acts, answer-only labels over `num_items_in_batch`.
"""
import hashlib
import os
import shutil

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tmp_scratch", "c01_out")
VOCAB = 64


class QA(Dataset):
    def __init__(self, n=20, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p = int(torch.randint(3, 7, (1,), generator=g))
            a = int(torch.randint(2, 10, (1,), generator=g))
            self.items.append((torch.randint(3, VOCAB, (p + a,), generator=g), p))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, p = self.items[i]
        return {"ids": ids, "p": p}


def collate(rows):
    L = max(len(r["ids"]) for r in rows)
    out = {"input_ids": torch.zeros(len(rows), L, dtype=torch.long),
           "attention_mask": torch.zeros(len(rows), L, dtype=torch.long),
           "labels": torch.full((len(rows), L), -100, dtype=torch.long)}
    for j, r in enumerate(rows):
        n = len(r["ids"])
        out["input_ids"][j, :n] = r["ids"]
        out["attention_mask"][j, :n] = 1
        out["labels"][j, r["p"]:n] = r["ids"][r["p"]:]
    return out


def build_model():
    set_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0)
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]))


def make_args(epochs, save):
    return TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=epochs, learning_rate=1e-2, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=0.3, weight_decay=0.0, save_strategy="epoch" if save else "no", save_only_model=False,
        logging_steps=100, report_to=[], seed=0, data_seed=0, use_cpu=True, ddp_backend="gloo",
        disable_tqdm=True, remove_unused_columns=False,
    )


def main():
    if int(os.environ.get("RANK", "0")) == 0 and os.path.isdir(OUT):
        shutil.rmtree(OUT)
    # phase 1: two epochs, checkpoint at each epoch end
    t1 = Trainer(model=build_model(), args=make_args(2, True), train_dataset=QA(), data_collator=collate)
    t1.train()
    ckpt = os.path.join(OUT, f"checkpoint-{t1.state.global_step}")
    del t1
    if dist.is_initialized():
        dist.barrier()

    # phase 2: fresh model, fresh Trainer, resume to three epochs
    t2 = Trainer(model=build_model(), args=make_args(3, False), train_dataset=QA(), data_collator=collate)
    t2.train(resume_from_checkpoint=ckpt)

    if t2.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in t2.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
