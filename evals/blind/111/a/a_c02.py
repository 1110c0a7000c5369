"""DPO written by hand as an HF Trainer subclass, on a PEFT LoRA adapter over a tiny Llama.

The reference policy is the same network with the adapter switched off. The collator
drops pairs longer than MAX_LEN (always keeping the shortest), so micro-batches hold
1-4 pairs; the loss is a sum over pairs divided by the window's pair count over all
ranks (times the world size, since DDP averages), with the Trainer told the loss is
already scaled for accumulation. LoRA+-style optimizer: the B matrices get 4x the LR.
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

MAX_LEN = 12
BETA = 0.2
SEED = 99


class PrefPairs(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = torch.randint(3, vocab, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
            lc, lr = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(2, 9, (1,), generator=g))
            chosen = (p[0] + torch.arange(lc)) % (vocab - 3) + 3
            rejected = torch.randint(3, vocab, (lr,), generator=g)
            self.rows.append((p, chosen, rejected))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        p, c, r = self.rows[i]
        return {"prompt": p, "chosen": c, "rejected": r}


def collate(batch):
    lens = [len(b["prompt"]) + max(len(b["chosen"]), len(b["rejected"])) for b in batch]
    keep = [b for b, L in zip(batch, lens) if L <= MAX_LEN] or [batch[lens.index(min(lens))]]
    seqs, masks = [], []
    for side in ("chosen", "rejected"):
        for b in keep:
            s = torch.cat([b["prompt"], b[side]])
            m = torch.zeros(len(s))
            m[len(b["prompt"]):] = 1
            seqs.append(s)
            masks.append(m)
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    att = torch.zeros(len(seqs), n, dtype=torch.long)
    comp = torch.zeros(len(seqs), n)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)], att[i, : len(s)], comp[i, : len(s)] = s, 1, m
    return {"input_ids": ids, "attention_mask": att, "completion_mask": comp, "n_pairs": torch.tensor(len(keep))}


def seq_logps(model, ids, att, comp):
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(-1)
    return (lp * comp[:, 1:]).sum(1)


class HandDPOTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            a_like = [p for n, p in named if "lora_B" not in n]
            b_like = [p for n, p in named if "lora_B" in n]
            self.optimizer = torch.optim.AdamW([{"params": a_like, "lr": self.args.learning_rate},
                                                {"params": b_like, "lr": 4 * self.args.learning_rate}],
                                               weight_decay=0.0)
        return self.optimizer

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        local = torch.tensor(float(sum(int(b["n_pairs"]) for b in batches)))
        self._window_pairs = self.accelerator.reduce(local, reduction="sum")
        return batches, None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = int(inputs["n_pairs"])
        ids, att, comp = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]
        pol = seq_logps(model, ids, att, comp)
        with torch.no_grad(), self.accelerator.unwrap_model(model).disable_adapter():
            ref = seq_logps(self.accelerator.unwrap_model(model), ids, att, comp)
        logits = BETA * ((pol[:n] - pol[n:]) - (ref[:n] - ref[n:]))
        loss = -F.logsigmoid(logits).sum() * self.args.world_size / self._window_pairs
        return (loss, logits) if return_outputs else loss


def main():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=4e-3,
        lr_scheduler_type="cosine",
        max_grad_norm=0.0,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        save_strategy="no",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = HandDPOTrainer(model=model, args=args, train_dataset=PrefPairs(96, cfg.vocab_size, seed=8),
                             data_collator=collate)
    trainer.loss_is_scaled_for_ga = True  # the loss is already over the window's pair count
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
