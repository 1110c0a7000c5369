"""The stock HF Trainer on a tiny Llama whose vocabulary is grown for new special tokens,
with the first decoder block frozen, a DataLoader worker, masked prompts and an epoch of
10 micro-batches per rank at K = 4 (windows of 4, 4, 2)."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

BASE_VOCAB, NEW_TOKENS, SEQ = 60, 4, 18


class ChatRows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            ids = torch.randint(0, BASE_VOCAB, (SEQ,), generator=g)
            plen = int(torch.randint(3, 13, (1,), generator=g))
            ids[0] = BASE_VOCAB                # <|user|>
            ids[plen - 1] = BASE_VOCAB + 1     # <|assistant|>
            ids[-1] = BASE_VOCAB + 2           # <|end|>
            labels = ids.clone()
            labels[:plen] = -100
            self.rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def main():
    set_seed(17)
    cfg = LlamaConfig(vocab_size=BASE_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS)
    for p in model.model.layers[0].parameters():
        p.requires_grad_(False)

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.splitext(os.path.basename(__file__))[0]),
        per_device_train_batch_size=2, gradient_accumulation_steps=4, num_train_epochs=3,
        learning_rate=2e-3, lr_scheduler_type="linear", warmup_steps=2, max_grad_norm=0.5,
        logging_strategy="no", save_strategy="no", report_to=[], seed=17, data_seed=17,
        ddp_backend="gloo", use_cpu=True, disable_tqdm=True, dataloader_num_workers=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ChatRows(40, seed=8))
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
