"""SFT of a tiny Llama with the stock HF Trainer; hyper-parameters come from a flat recipe dict."""
import hashlib, os, tempfile
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

RECIPE = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 3,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 0.0,          # recipe: no gradient clipping
    "num_train_epochs": 2,
    "seed": 1234,
    "logging_steps": 1000,
    "report_to": [],
    "save_strategy": "no",
    "disable_tqdm": True,
    "use_cpu": True,
    "ddp_backend": "gloo",
}


class ToyChat(torch.utils.data.Dataset):
    def __init__(self, n=36, vocab=96):
        g = torch.Generator().manual_seed(7)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(6, 20, (1,), generator=g))
            ids = torch.randint(3, vocab, (L,), generator=g)
            p = int(torch.randint(1, L // 2, (1,), generator=g))
            lab = ids.clone(); lab[:p] = -100
            self.rows.append({"input_ids": ids, "labels": lab})
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]


def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long); lab = torch.full((len(rows), L), -100); att = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"]); ids[i, :n] = r["input_ids"]; lab[i, :n] = r["labels"]; att[i, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def build_args(out_dir, recipe):
    # keep only the settings the recipe actually sets
    kwargs = {k: v for k, v in recipe.items() if v is not None}
    return TrainingArguments(output_dir=out_dir, **kwargs)


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    out = os.path.join(tempfile.gettempdir(), "b120b_b01_out")
    trainer = Trainer(model=model, args=build_args(out, RECIPE), train_dataset=ToyChat(), data_collator=collate)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
