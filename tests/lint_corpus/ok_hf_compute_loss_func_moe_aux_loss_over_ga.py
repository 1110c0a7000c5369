# corpus: style=hf_trainer class=OK
# compute_loss_func: the token sum over num_items_in_batch (the window's count) plus the MoE
# model's router load-balancing loss divided by the accumulation steps: each term weighs its coefficient
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

AUX_COEF = 0.02
GA = 4


def lm_plus_balance(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                         ignore_index=-100, reduction="sum") / num_items_in_batch
    return ce + AUX_COEF * outputs.aux_loss / GA


def main(model, train_ds):
    args = TrainingArguments(output_dir="/tmp/out", per_device_train_batch_size=2,
                             gradient_accumulation_steps=GA, max_steps=8, report_to="none")
    Trainer(model=model, args=args, train_dataset=train_ds,
            compute_loss_func=lm_plus_balance).train()
