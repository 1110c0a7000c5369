"""Masked-prompt SFT of a tiny Llama with the stock HF Trainer.

Token-level loss via `compute_loss_func` (sum over completion tokens / num_items_in_batch).
28 samples over 2 ranks at 2 per device -> 7 micro-batches per rank per epoch, K = 3:
windows of 3, 3 and 1. Clipping at 0.3.
"""
import hashlib
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

SEED = 21
VOCAB = 128
SEQ = 16


class PromptCompletion(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.prompt_len = torch.randint(3, 11, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[: int(self.prompt_len[i])] = -100
        return {"input_ids": self.ids[i], "labels": labels}


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def completion_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    target = labels[:, 1:]
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                            ignore_index=-100, reduction="sum")
    return total / num_items_in_batch


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=False))
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="b_c01_"),
                             per_device_train_batch_size=2, gradient_accumulation_steps=3,
                             num_train_epochs=2, learning_rate=2e-3, weight_decay=0.01,
                             lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.3,
                             use_cpu=True, seed=SEED, data_seed=SEED, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletion(28),
                      data_collator=collate, compute_loss_func=completion_loss)
    assert trainer.args.world_size == 2
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {param_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
