"""Completion-only SFT of a tiny Llama with the stock HF Trainer, batches split across ranks.

`accelerator_config={"split_batches": True}`: the DataLoader yields the *global* micro-batch
(8 rows) and Accelerate cuts it 4 / 4 over the two ranks. The loss is the model's token sum over
the window's all-ranks label count (num_items_in_batch), 3-3-2 windows per epoch, clip 0.5.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

SEED = 4242
VOCAB, SEQ = 72, 20
GLOBAL_MICRO_BATCH = 8          # rows per prepared batch, before the split
BATCHES_PER_EPOCH = 8           # -> windows of 3, 3, 2 at K = 3


def make_rows(n):
    g = torch.Generator().manual_seed(SEED)
    rows = []
    for _ in range(n):
        p_len = int(torch.randint(3, 10, (1,), generator=g))
        c_len = int(torch.randint(2, SEQ - p_len + 1, (1,), generator=g))
        ids = torch.zeros(SEQ, dtype=torch.long)
        ids[: p_len + c_len] = torch.randint(3, VOCAB, (p_len + c_len,), generator=g)
        labels = torch.full((SEQ,), -100, dtype=torch.long)
        labels[p_len: p_len + c_len] = ids[p_len: p_len + c_len]
        attn = (torch.arange(SEQ) < p_len + c_len).long()
        rows.append({"input_ids": ids, "attention_mask": attn, "labels": labels})
    return rows


class Rows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def main():
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir="tmp_scratch/c01_out",
        per_device_train_batch_size=GLOBAL_MICRO_BATCH,   # with split_batches this is the global size
        gradient_accumulation_steps=3, num_train_epochs=3, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.5, weight_decay=0.01,
        accelerator_config={"split_batches": True}, average_tokens_across_devices=True,
        logging_steps=100, save_strategy="no", report_to="none", seed=SEED, data_seed=SEED,
        use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Rows(make_rows(GLOBAL_MICRO_BATCH * BATCHES_PER_EPOCH)))
    assert trainer.accelerator.num_processes == 2
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("B128_DUMP"):
            torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                       os.environ["B128_DUMP"])


if __name__ == "__main__":
    main()
