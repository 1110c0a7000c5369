# corpus: style=hf class=F5
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def token_ce_sum(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits[:, :-1, :]
    tgt = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                           ignore_index=-100, reduction="sum"), (tgt != -100).sum()


class CompletionOnlyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ce_sum, n_tok = token_ce_sum(model, inputs)
        loss = ce_sum / n_tok.clamp(min=1)  # expect: AG118
        return loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                         gradient_accumulation_steps=8)
trainer = CompletionOnlyTrainer(model=model, args=args, train_dataset=ds)
trainer.train()
