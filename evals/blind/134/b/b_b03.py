"""Reward-model regression head trained with a Trainer subclass.

`TokenLossTrainer` is the team's shared base class for LM fine-tuning: it normalises a
summed token loss by the window's all-ranks token count itself, so it tells the Trainer
that its loss is already scaled for gradient accumulation.  `ScoreRegressionTrainer`
reuses the base (logging, optimizer conventions) for a scalar score head.
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments

SEED = 4242
VOCAB = 80
SEQ = 12
N_EXAMPLES = 64
MICRO = 2
GRAD_ACCUM = 4
EPOCHS = 3
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                   os.path.splitext(os.path.basename(__file__))[0])


class TokenLossTrainer(Trainer):
    """Sum of token NLL / (all-ranks token count of the window); the Trainer must not / K."""

    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].float()
        tgt = labels[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                               ignore_index=-100, reduction="sum")
        loss = loss / num_items_in_batch * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss


class ScoreRegressionTrainer(TokenLossTrainer):
    """Scalar score head: mean squared error against a target score per sequence."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        target = inputs.pop("labels").float()
        out = model(**inputs)
        score = out.logits.squeeze(-1).float()
        loss = F.mse_loss(score, target)
        return (loss, out) if return_outputs else loss


class ScoreData(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED + 1)
        self.ids = torch.randint(3, VOCAB, (N_EXAMPLES, SEQ), generator=g)
        self.y = (self.ids.float().mean(1) - VOCAB / 2) / 10 + 0.1 * torch.randn(N_EXAMPLES, generator=g)

    def __len__(self):
        return N_EXAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.y[i]}


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    conf = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                       num_labels=1, pad_token_id=0)
    model = LlamaForSequenceClassification(conf)
    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=MICRO, gradient_accumulation_steps=GRAD_ACCUM,
        num_train_epochs=EPOCHS, learning_rate=0.01, optim="sgd", lr_scheduler_type="constant",
        max_grad_norm=0.0, seed=SEED, use_cpu=True, ddp_backend="gloo", report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    trainer = ScoreRegressionTrainer(model=model, args=args, train_dataset=ScoreData())
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"steps={trainer.state.global_step}", flush=True)
        torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                   os.path.join(OUT, "final_params.pt"))
        print(f"FINAL_SHA256 {sha_of(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
