# Bradley-Terry reward model: a LoRA-adapted decoder backbone plus a scalar score head,
# trained with a Trainer subclass in the style of TRL's RewardTrainer.
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaModel, Trainer, TrainingArguments, set_seed

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b03_out")


@dataclass
class RewardConfig:
    seed: int = 11
    vocab: int = 96
    seq_len: int = 20
    hidden: int = 48
    pairs_per_device: int = 4
    grad_accum: int = 3
    max_steps: int = 8
    lr: float = 1e-3
    head_lr: float = 5e-3
    lora_targets: list = field(default_factory=lambda: ["q_proj", "v_proj", "gate_proj"])


class PreferencePairs(Dataset):
    def __init__(self, n, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.chosen = torch.randint(1, cfg.vocab, (n, cfg.seq_len), generator=g)
        self.rejected = torch.randint(1, cfg.vocab, (n, cfg.seq_len), generator=g)
        # make the preference learnable: chosen answers end in low token ids
        self.chosen[:, -4:] = self.chosen[:, -4:] % 16

    def __len__(self):
        return self.chosen.shape[0]

    def __getitem__(self, i):
        return {"chosen_ids": self.chosen[i], "rejected_ids": self.rejected[i]}


class PairwiseRewardTrainer(Trainer):
    def __init__(self, model, score_head, reward_cfg, **kwargs):
        model.add_module("score_head", score_head)  # so the DDP wrapper sees (and averages) the head
        self.score_head = score_head
        self.reward_cfg = reward_cfg
        super().__init__(model=model, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            backbone = [p for n, p in self.model.named_parameters() if p.requires_grad and "score" not in n]
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": backbone, "lr": self.reward_cfg.lr},
                    {"params": list(self.score_head.parameters()), "lr": self.reward_cfg.head_lr},
                ],
                weight_decay=0.0,
            )
        return self.optimizer

    def _rewards(self, model, ids):
        hidden = model(input_ids=ids).last_hidden_state
        return self.score_head(hidden[:, -1]).squeeze(-1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        chosen = inputs["chosen_ids"]
        rejected = inputs["rejected_ids"]
        rewards = self._rewards(model, torch.cat([chosen, rejected], dim=0))
        r_c, r_r = rewards.chunk(2)
        loss = -F.logsigmoid(r_c - r_r).mean()
        return (loss, {"rewards_chosen": r_c, "rewards_rejected": r_r}) if return_outputs else loss


def main():
    cfg = RewardConfig()
    set_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    backbone = LlamaModel(LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=32))
    model = get_peft_model(backbone, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=cfg.lora_targets))
    score_head = nn.Linear(cfg.hidden, 1)

    n = cfg.pairs_per_device * cfg.grad_accum * 2 * cfg.max_steps
    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=cfg.pairs_per_device, gradient_accumulation_steps=cfg.grad_accum,
        max_steps=cfg.max_steps, lr_scheduler_type="constant", max_grad_norm=0.0, seed=cfg.seed, data_seed=cfg.seed,
        use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no", logging_steps=4,
        remove_unused_columns=False, disable_tqdm=True, ddp_find_unused_parameters=False,
    )
    trainer = PairwiseRewardTrainer(model=model, score_head=score_head, reward_cfg=cfg, args=args,
                                    train_dataset=PreferencePairs(n, cfg))
    trainer.train()

    everything = nn.ModuleDict({"backbone": trainer.model, "score_head": trainer.score_head})
    h = hashlib.sha256()
    for _, p in everything.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
