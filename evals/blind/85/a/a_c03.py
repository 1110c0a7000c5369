"""PyTorch Lightning Trainer fine-tuning a PEFT LoRA adapter (plus a fully trained lm_head)
on a tiny random Llama. DDP on 2 CPU processes, bf16-mixed, accumulate_grad_batches=2,
gradient_clip_val=0.3, a DataLoader with a worker process, warm-up + linear decay sized
from estimated_stepping_batches. Fixed-length sequences: every micro-batch has the same
number of target tokens."""
import hashlib

import torch
from torch.utils.data import DataLoader, Dataset
import pytorch_lightning as pl
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

SEED = 3
SEQ = 12


class Motifs(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(1, vocab, (n, 1), generator=g)
        step = torch.randint(1, 5, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(SEQ)[None]) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


class LoraLM(pl.LightningModule):
    def __init__(self, lr=4e-3, warmup=2):
        super().__init__()
        self.lr, self.warmup = lr, warmup
        cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
        base = LlamaForCausalLM(cfg)
        self.net = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                                   target_modules=["k_proj", "o_proj", "down_proj"],
                                                   modules_to_save=["lm_head"]))

    def training_step(self, ids, batch_idx):
        out = self.net(input_ids=ids, labels=ids)
        self.log("loss", out.loss.detach(), sync_dist=False)
        return out.loss

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=0.01)
        total = self.trainer.estimated_stepping_batches
        w = self.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / w if s < w else max(0.0, (total - s) / (total - w)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(SEED, workers=True)
    model = LoraLM()
    loader = DataLoader(Motifs(48, 48, SEED), batch_size=3, shuffle=True, num_workers=1,
                        persistent_workers=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=3, accumulate_grad_batches=2, gradient_clip_val=0.3,
                         gradient_clip_algorithm="norm", deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"global_step {trainer.global_step}")
        print(f"FINAL_SHA256 {params_sha(model)}")


if __name__ == "__main__":
    main()
