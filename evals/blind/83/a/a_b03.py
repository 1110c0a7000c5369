"""Multi-task regression + classification with learned homoscedastic task weights
(Kendall et al.), trained with a subclassed HF Trainer. The task log-variances get their
own optimizer.

torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 34005 a_b03.py
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed

SEED = 11
N_FEAT, N_CLS = 16, 5


class MultiTaskData(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, N_FEAT, generator=g)
        w = torch.randn(N_FEAT, generator=g)
        self.y_reg = self.x @ w * 2.0 + 0.5 * torch.randn(n, generator=g)
        self.y_cls = (self.x[:, :N_CLS] * 3 + torch.randn(n, N_CLS, generator=g)).argmax(-1)

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return {"features": self.x[i], "reg_target": self.y_reg[i], "cls_target": self.y_cls[i]}


class MultiTaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(N_FEAT, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.reg_head = nn.Linear(64, 1)
        self.cls_head = nn.Linear(64, N_CLS)
        # log sigma^2 per task, learned
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, features, reg_target=None, cls_target=None):
        h = self.trunk(features)
        reg = self.reg_head(h).squeeze(-1)
        logits = self.cls_head(h)
        loss = None
        if reg_target is not None:
            mse = F.mse_loss(reg, reg_target)
            ce = F.cross_entropy(logits, cls_target)
            s = self.log_vars
            loss = 0.5 * torch.exp(-s[0]) * mse + 0.5 * s[0] + torch.exp(-s[1]) * ce + 0.5 * s[1]
        return {"loss": loss, "reg": reg, "logits": logits}


class UncertaintyWeightedTrainer(Trainer):
    def __init__(self, *args, task_weight_lr=0.05, **kwargs):
        super().__init__(*args, **kwargs)
        self.task_weight_lr = task_weight_lr
        self.task_weight_optimizer = None

    def create_optimizer(self, model=None):
        net = self.model
        main_params = [p for n, p in net.named_parameters() if not n.startswith("log_vars")]
        self.optimizer = torch.optim.AdamW(main_params, lr=self.args.learning_rate,
                                           weight_decay=self.args.weight_decay)
        self.task_weight_optimizer = torch.optim.SGD([net.log_vars], lr=self.task_weight_lr)
        return self.optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.task_weight_optimizer.step()
        self.task_weight_optimizer.zero_grad()
        return loss


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    args = TrainingArguments(
        output_dir="_out_a_b03", per_device_train_batch_size=8, gradient_accumulation_steps=4,
        num_train_epochs=2, learning_rate=3e-3, weight_decay=0.0, lr_scheduler_type="constant",
        max_grad_norm=0.0, seed=SEED, data_seed=SEED, use_cpu=True, ddp_backend="gloo",
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False,
    )
    model = MultiTaskNet()
    trainer = UncertaintyWeightedTrainer(model=model, args=args,
                                         train_dataset=MultiTaskData(192, SEED))
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
