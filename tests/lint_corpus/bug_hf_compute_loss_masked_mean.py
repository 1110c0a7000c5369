# corpus: style=hf class=F5
import torch.nn.functional as F
from trl import SFTConfig, SFTTrainer


class CompletionOnlyTrainer(SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mask = inputs.pop("completion_mask")
        labels = inputs["input_ids"][:, 1:]
        logits = model(**inputs).logits[:, :-1]
        tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        loss = (tok * mask[:, 1:]).sum() / mask[:, 1:].sum()  # expect: AG118
        return loss


cfg = SFTConfig(output_dir="sft", gradient_accumulation_steps=16, per_device_train_batch_size=1)
CompletionOnlyTrainer(model=model, args=cfg, train_dataset=ds).train()
