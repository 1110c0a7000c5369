# corpus: style=hf class=OK
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

CFG = {"grad_accum": 3, "act_reg": 0.1}


def lm_token_sum(logits, labels):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                           ignore_index=-100, reduction="sum")


def pooled_norm(hidden, labels):
    m = (labels != -100).unsqueeze(-1).to(hidden.dtype)
    return ((hidden * m).sum(1) / m.sum(1)).pow(2).sum(-1)


def make_loss_fn(cfg):
    def loss_fn(outputs, labels, num_items_in_batch=None):
        lm = lm_token_sum(outputs.logits, labels) / num_items_in_batch
        aux = pooled_norm(outputs.hidden_states[-1], labels).mean()
        return lm + cfg["act_reg"] * aux / cfg["grad_accum"]
    return loss_fn


def main(model, train_ds):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=CFG["grad_accum"],
                             report_to="none", use_cpu=True)
    Trainer(model=model, args=args, train_dataset=train_ds,
            compute_loss_func=make_loss_fn(CFG)).train()
