"""Stock HF Trainer with a client optimizer (two AdamW groups), a frozen token embedding,
a warm-up/decay LambdaLR sized in optimizer steps, a clip that acts and 3-3-1 windows."""
import hashlib, math, os, tempfile
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

K, MICRO_BS, EPOCHS, N_ROWS, WORLD = 3, 2, 2, 28, 2


class Rows(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(11)
        self.rows = []
        for _ in range(N_ROWS):
            L = int(torch.randint(6, 22, (1,), generator=g))
            ids = torch.randint(2, 96, (L,), generator=g)
            self.rows.append({"input_ids": ids, "labels": ids.clone()})
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
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)

    head = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("lm_head")]
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("lm_head")]
    opt = torch.optim.AdamW([{"params": body, "lr": 4e-3}, {"params": head, "lr": 1e-3}], weight_decay=0.01)
    micro_per_rank = math.ceil(N_ROWS / (MICRO_BS * WORLD))            # 7 -> windows 3, 3, 1
    total_steps = math.ceil(micro_per_rank / K) * EPOCHS               # optimizer steps
    warm = 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total_steps - s) / (total_steps - warm)))

    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "b120b_c01_out"), per_device_train_batch_size=MICRO_BS,
        gradient_accumulation_steps=K, num_train_epochs=EPOCHS, max_grad_norm=0.3, seed=5, report_to=[],
        save_strategy="no", logging_steps=1000, disable_tqdm=True, use_cpu=True, ddp_backend="gloo")
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), data_collator=collate, optimizers=(opt, sched))
    trainer.train()
    assert trainer.state.global_step == total_steps, (trainer.state.global_step, total_steps)
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
