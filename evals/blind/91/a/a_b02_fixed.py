"""Small intent classifier trained with a Trainer subclass.

The subclass adds a z-loss on the logits (keeps logsumexp near 0) inside its own
`training_step`, which was written against an older transformers release.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
from transformers import Trainer, TrainingArguments, set_seed


class IntentNet(nn.Module):
    def __init__(self, in_dim=12, hidden=24, n_cls=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.cls = nn.Linear(hidden, n_cls)

    def forward(self, x, labels=None):
        logits = self.cls(self.body(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class SyntheticIntents(torch.utils.data.Dataset):
    def __init__(self, n, in_dim=12, n_cls=5, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, in_dim, generator=g)
        proto = torch.randn(n_cls, in_dim, generator=g)
        self.y = (self.x @ proto.T + 0.5 * torch.randn(n, n_cls, generator=g)).argmax(-1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class ZLossTrainer(Trainer):
    def __init__(self, *args, z_coef=1e-2, **kwargs):
        super().__init__(*args, **kwargs)
        self.z_coef = z_coef

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
            z = outputs["logits"].logsumexp(dim=-1)
            loss = loss + self.z_coef * z.pow(2).mean()
        if self.current_gradient_accumulation_steps > 1:
            loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--n-train", type=int, default=56)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main():
    a = parse()
    set_seed(a.seed)
    model = IntentNet()
    args = TrainingArguments(
        output_dir="/tmp/a_b02_trainer_out",
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum,
        num_train_epochs=a.epochs,
        learning_rate=a.lr,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        seed=a.seed,
        data_seed=a.seed,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        dataloader_drop_last=False,
        disable_tqdm=True,
    )
    trainer = ZLossTrainer(model=model, args=args, train_dataset=SyntheticIntents(a.n_train, seed=a.seed))
    assert trainer.args.world_size == 2
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
