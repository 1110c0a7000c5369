"""HF Trainer with a label-smoothed `compute_loss_func` summed over the window's all-ranks
`num_items_in_batch`, a vocabulary grown by `resize_token_embeddings` for new special tokens,
and 2-2-1 windows."""
import hashlib, os, tempfile
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

BASE_VOCAB, NEW_TOKENS = 90, 6


def smoothed_ce(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    tgt = labels[:, 1:]
    mask = tgt.ne(-100)
    logp = F.log_softmax(logits[mask], dim=-1)
    t = tgt[mask]
    nll = -logp.gather(-1, t[:, None]).squeeze(-1)
    smooth = -logp.mean(-1)
    total = (0.9 * nll + 0.1 * smooth).sum()
    return total / num_items_in_batch


class Turns(torch.utils.data.Dataset):
    def __init__(self, n=20):
        g = torch.Generator().manual_seed(31)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(6, 20, (1,), generator=g))
            ids = torch.randint(1, BASE_VOCAB, (L,), generator=g)
            ids[0] = BASE_VOCAB + int(torch.randint(0, NEW_TOKENS, (1,), generator=g))   # a new role token
            lab = ids.clone(); lab[:2] = -100
            self.rows.append({"input_ids": ids, "labels": lab})
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]


def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long); lab = torch.full((len(rows), L), -100); att = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"]); ids[i, :n] = r["input_ids"]; lab[i, :n] = r["labels"]; att[i, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def main():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=BASE_VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    model.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS, mean_resizing=False)
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "b120b_c03_out"), per_device_train_batch_size=2,
        gradient_accumulation_steps=2, num_train_epochs=3, learning_rate=3e-3, lr_scheduler_type="cosine",
        warmup_steps=1, max_grad_norm=0.0, seed=3, report_to=[], save_strategy="no", logging_steps=1000,
        disable_tqdm=True, use_cpu=True, ddp_backend="gloo")
    trainer = Trainer(model=model, args=args, train_dataset=Turns(), data_collator=collate, compute_loss_func=smoothed_ce)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
