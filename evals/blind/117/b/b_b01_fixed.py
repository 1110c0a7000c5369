"""Pairwise reward model trained with a Trainer subclass (TRL RewardTrainer style)."""
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments

torch.use_deterministic_algorithms(True)


class PairDataset(Dataset):
    def __init__(self, n_pairs=96, seq_len=12, vocab=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.chosen = torch.randint(1, vocab, (n_pairs, seq_len), generator=g)
        self.rejected = torch.randint(1, vocab, (n_pairs, seq_len), generator=g)
        # make "chosen" recognisable: it ends in a small token id
        self.chosen[:, -1] = torch.randint(1, 8, (n_pairs,), generator=g)

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, i):
        return {"chosen_input_ids": self.chosen[i], "rejected_input_ids": self.rejected[i]}


class RewardTrainer(Trainer):
    """Bradley-Terry loss; chosen and rejected go through one forward."""

    def _rewards(self, model, chosen, rejected):
        ids = torch.cat([chosen, rejected], dim=0)
        scores = model(input_ids=ids).logits.squeeze(-1)
        return scores.chunk(2)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        r_c, r_r = self._rewards(model, inputs["chosen_input_ids"], inputs["rejected_input_ids"])
        loss = -F.logsigmoid(r_c - r_r).mean()
        return (loss, {"r_c": r_c, "r_r": r_r}) if return_outputs else loss


def sha_params(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      num_labels=1, pad_token_id=0)
    model = LlamaForSequenceClassification(cfg)
    args = TrainingArguments(
        output_dir="tmp_scratch/b01_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=3e-4,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=1.0,
        weight_decay=0.0,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=PairDataset())
    trainer.train()
    if trainer.args.process_index == 0:
        print("FINAL_SHA256", sha_params(trainer.model), flush=True)


if __name__ == "__main__":
    main()
