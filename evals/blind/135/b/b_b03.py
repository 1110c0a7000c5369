"""Causal-LM SFT with the stock HF Trainer and a PaLM-style z-loss via compute_loss_func."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


@dataclass
class LossConfig:
    z_loss_coef: float = 1e-2
    ignore_index: int = -100


class ChatDataset(Dataset):
    def __init__(self, n=128, seq=16, vocab=128, seed=5):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq), generator=g)
        self.prompt_len = torch.randint(3, 10, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[: self.prompt_len[i]] = -100
        return {"input_ids": self.ids[i], "labels": labels}


def make_loss_fn(cfg: LossConfig):
    def loss_fn(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[:, :-1].float()
        targets = labels[:, 1:]
        mask = targets != cfg.ignore_index
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                             ignore_index=cfg.ignore_index, reduction="sum") / num_items_in_batch
        lse = torch.logsumexp(logits, dim=-1)
        z = (lse[mask] ** 2).mean()
        return ce + cfg.z_loss_coef * z

    return loss_fn


def main():
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir="tmp_scratch/b03_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        ddp_backend="gloo",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ChatDataset(),
                      compute_loss_func=make_loss_fn(LossConfig(z_loss_coef=0.05)))
    trainer.train()

    rank = dist.get_rank() if dist.is_initialized() else 0
    m = trainer.accelerator.unwrap_model(trainer.model)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")


if __name__ == "__main__":
    main()
