"""SFT of a LoRA adapter with the HF Trainer and a custom token-level loss.

The loss is normalised by the Trainer's `num_items_in_batch` (summed token loss over
all tokens of the accumulated batch), so gradient accumulation matches the large batch.
"""
import hashlib
import os

import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

PAD_ID = 0
VOCAB = 96
SEED = 1234


class ToySFT(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(5, 24, (1,), generator=g))
            self.rows.append(torch.randint(1, VOCAB, (length,), generator=g))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for r, f in enumerate(features):
        n = len(f["input_ids"])
        ids[r, :n] = f["input_ids"]
        mask[r, :n] = 1
    labels = ids.clone()
    labels[mask == 0] = -100  # padded positions are ignored by the loss and by the Trainer's token count
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def token_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1, :].float()
    targets = labels[:, 1:].to(logits.device)
    summed = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return summed / num_items_in_batch


def build_model():
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=PAD_ID, tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights="gaussian")
    return get_peft_model(base, lora)


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    if os.environ.get("PARAM_DUMP"):
        torch.save(flat, os.environ["PARAM_DUMP"])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    set_seed(SEED)
    model = build_model()
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b01_out"),
        per_device_train_batch_size=3,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        seed=SEED,
        data_seed=SEED,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ToySFT(96, SEED), data_collator=collate,
                      compute_loss_func=token_loss)
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
