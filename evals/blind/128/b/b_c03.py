"""LoRA SFT with the stock HF Trainer on a tiny Llama whose vocabulary was grown by 8 tokens.

Only the 8 new embedding rows are trained (PEFT `trainable_token_indices`) next to the LoRA
adapters; gradient checkpointing, a worker DataLoader, a clip of 0.3 that acts, and epochs of
10 micro-batches per rank at K = 4 (windows 4-4-2), which the Trainer normalises by each
window's own all-ranks label count.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

SEED = 2718
OLD_VOCAB, NEW_TOKENS, SEQ = 64, 8, 16
MICRO_BS, K, EPOCHS = 2, 4, 2
N_ROWS = 2 * MICRO_BS * 10


class ChatTurns(Dataset):
    """A prompt, then an answer that uses the new special tokens; answer tokens only in the loss."""

    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        vocab = OLD_VOCAB + NEW_TOKENS
        self.items = []
        for _ in range(N_ROWS):
            p = int(torch.randint(3, 8, (1,), generator=g))
            a = int(torch.randint(2, SEQ - p + 1, (1,), generator=g))
            ids = torch.zeros(SEQ, dtype=torch.long)
            ids[:p] = torch.randint(3, OLD_VOCAB, (p,), generator=g)
            ids[p:p + a] = torch.randint(OLD_VOCAB - 8, vocab, (a,), generator=g)
            labels = torch.full((SEQ,), -100)
            labels[p:p + a] = ids[p:p + a]
            self.items.append({"input_ids": ids, "attention_mask": (torch.arange(SEQ) < p + a).long(),
                               "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def build():
    base = LlamaForCausalLM(LlamaConfig(vocab_size=OLD_VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2, tie_word_embeddings=False))
    base.resize_token_embeddings(OLD_VOCAB + NEW_TOKENS, mean_resizing=False)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"],
                      trainable_token_indices={"embed_tokens": list(range(OLD_VOCAB, OLD_VOCAB + NEW_TOKENS))})
    return get_peft_model(base, lora)


def main():
    set_seed(SEED)
    model = build()
    args = TrainingArguments(
        output_dir="tmp_scratch/c03_out", per_device_train_batch_size=MICRO_BS, gradient_accumulation_steps=K,
        num_train_epochs=EPOCHS, learning_rate=5e-3, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.3, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=1, logging_steps=100, save_strategy="no", report_to="none",
        seed=SEED, data_seed=SEED, use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ChatTurns())
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
