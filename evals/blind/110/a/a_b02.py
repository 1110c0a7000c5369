"""RPO (DPO + chosen-NLL) on a LoRA adapter, written on Accelerate in the style of
TRL's DPOTrainer: concatenated forward, the reference model is the base model
with the adapter switched off, the NLL term is token-level over the window.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

PAD = 0


@dataclass
class RPOConfig:
    seed: int = 7
    beta: float = 0.1
    rpo_alpha: float = 1.0
    learning_rate: float = 2e-3
    per_device_train_batch_size: int = 2
    gradient_accumulation_steps: int = 3
    num_train_epochs: int = 4
    n_pairs: int = 24
    prompt_len: int = 4
    max_completion_len: int = 8
    lora_targets: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class PairDataset(Dataset):
    """prompt + chosen / prompt + rejected, right padded, completions of 2..8 tokens."""

    def __init__(self, cfg, vocab):
        g = torch.Generator().manual_seed(cfg.seed)
        L = cfg.prompt_len + cfg.max_completion_len
        self.items = []
        for _ in range(cfg.n_pairs):
            prompt = torch.randint(3, vocab, (cfg.prompt_len,), generator=g)
            row = {}
            for key in ("chosen", "rejected"):
                n = int(torch.randint(2, cfg.max_completion_len + 1, (1,), generator=g))
                comp = torch.randint(3, vocab, (n,), generator=g)
                ids = torch.full((L,), PAD)
                ids[: cfg.prompt_len] = prompt
                ids[cfg.prompt_len: cfg.prompt_len + n] = comp
                mask = torch.zeros(L, dtype=torch.long)
                mask[: cfg.prompt_len + n] = 1
                labels = torch.full((L,), -100)
                labels[cfg.prompt_len: cfg.prompt_len + n] = comp
                row[key + "_input_ids"], row[key + "_attention_mask"], row[key + "_labels"] = ids, mask, labels
            self.items.append(row)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class RPOTrainer:
    def __init__(self, cfg: RPOConfig):
        self.cfg = cfg
        plugin = GradientAccumulationPlugin(num_steps=cfg.gradient_accumulation_steps, sync_with_dataloader=False)
        self.accelerator = Accelerator(gradient_accumulation_plugin=plugin, cpu=True)
        set_seed(cfg.seed)
        mcfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
        base = LlamaForCausalLM(mcfg)
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                target_modules=cfg.lora_targets, init_lora_weights="gaussian"))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
        loader = DataLoader(PairDataset(cfg, mcfg.vocab_size), batch_size=cfg.per_device_train_batch_size,
                            shuffle=False)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)

    # ---------------------------------------------------------------- helpers
    def _across_ranks(self, value):
        """Scalar statistics (margins, accuracies, token counts) over all ranks."""
        t = torch.as_tensor(value, dtype=torch.float32, device=self.accelerator.device)
        return self.accelerator.reduce(t, reduction="mean")

    @staticmethod
    def _concat(batch):
        return {k: torch.cat([batch["chosen_" + k], batch["rejected_" + k]], 0)
                for k in ("input_ids", "attention_mask", "labels")}

    @staticmethod
    def _token_logps(logits, labels):
        labels = labels[:, 1:]
        logits = logits[:, :-1]
        mask = labels != -100
        lp = torch.gather(logits.log_softmax(-1), 2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return lp * mask, mask

    def concatenated_forward(self, model, batch):
        c = self._concat(batch)
        logits = model(input_ids=c["input_ids"], attention_mask=c["attention_mask"]).logits
        lp, mask = self._token_logps(logits, c["labels"])
        return lp, mask

    # ------------------------------------------------------------------ loss
    def compute_loss(self, batch, window_tokens):
        cfg = self.cfg
        n = batch["chosen_input_ids"].shape[0]
        with torch.no_grad(), self.accelerator.unwrap_model(self.model).disable_adapter():
            ref_lp, _ = self.concatenated_forward(self.model, batch)
        lp, mask = self.concatenated_forward(self.model, batch)
        seq = lp.sum(-1)
        ref_seq = ref_lp.sum(-1)
        logits = cfg.beta * ((seq[:n] - ref_seq[:n]) - (seq[n:] - ref_seq[n:]))
        dpo = -F.logsigmoid(logits).mean()
        # chosen NLL: token sum over the window's tokens on all ranks
        # (x K x W: Accelerate divides by K and DDP averages over W)
        K, W = cfg.gradient_accumulation_steps, self.accelerator.num_processes
        nll = -lp[:n].sum() * K * W / window_tokens
        return dpo + cfg.rpo_alpha * nll

    def train(self):
        cfg, acc = self.cfg, self.accelerator
        K = cfg.gradient_accumulation_steps
        for epoch in range(cfg.num_train_epochs):
            self.model.train()
            it = iter(self.loader)
            for _ in range(len(self.loader) // K):
                window = [next(it) for _ in range(K)]
                local = sum(int((b["chosen_labels"][:, 1:] != -100).sum()) for b in window)
                window_tokens = self._across_ranks(local)
                for batch in window:
                    with acc.accumulate(self.model):
                        loss = self.compute_loss(batch, window_tokens)
                        acc.backward(loss)
                        self.optimizer.step()
                        self.optimizer.zero_grad()
        acc.wait_for_everyone()


def main():
    torch.use_deterministic_algorithms(True)
    trainer = RPOTrainer(RPOConfig())
    trainer.train()
    acc = trainer.accelerator
    if acc.is_main_process:
        model = acc.unwrap_model(trainer.model)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    acc.end_training()


if __name__ == "__main__":
    main()
