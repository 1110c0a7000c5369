"""SFT of a tiny Llama with the HF Trainer and a custom `compute_loss_func`.

Prompts are masked out of the labels, so every micro-batch carries a different
number of supervised tokens. The loss adds a little label smoothing, which is why
we pass our own `compute_loss_func` instead of relying on the model's loss.
"""
import hashlib, os

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, PAD = 96, 0
SMOOTH = 0.05


def build_dataset(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p_len = int(torch.randint(2, 10, (1,), generator=g))
        a_len = int(torch.randint(1, 12, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (p_len + a_len,), generator=g)
        labels = ids.clone()
        labels[:p_len] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), L), PAD, dtype=torch.long)
    lab = torch.full((len(rows), L), -100, dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = r["input_ids"]; lab[i, :n] = r["labels"]; att[i, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def smoothed_lm_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs["logits"][:, :-1, :].float()
    target = labels[:, 1:].to(logits.device)
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1),
        ignore_index=-100, label_smoothing=SMOOTH,
    )
    return loss


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if os.environ.get("PARAM_DUMP"):
        torch.save([p.detach().float().cpu() for _, p in module.named_parameters()], os.environ["PARAM_DUMP"])
    return h.hexdigest()


def main():
    set_seed(21)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir="/tmp/blind84_a_b03_out", use_cpu=True, per_device_train_batch_size=2,
        gradient_accumulation_steps=4, num_train_epochs=1, learning_rate=2e-3,
        lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0, max_grad_norm=0.0,
        save_strategy="no", report_to=[], logging_steps=1000, seed=21, data_seed=21,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=build_dataset(96),
                      data_collator=collate, compute_loss_func=smoothed_lm_loss)
    trainer.train()
    if trainer.is_world_process_zero():
        print("FINAL_SHA256", param_sha(trainer.model))


if __name__ == "__main__":
    main()
