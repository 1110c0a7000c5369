# corpus: style=hf class=F5
# a Seq2SeqTrainer whose label-smoothed criterion is built in __init__ and called as
# self.criterion: a per-micro-batch token mean, num_items_in_batch ignored, GA 4
import torch.nn as nn
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments


class SmoothedTrainer(Seq2SeqTrainer):
    def __init__(self, *args, smoothing=0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.criterion = nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=smoothing)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs, decoder_input_ids=inputs.get("decoder_input_ids"))
        logits = outputs.logits
        loss = self.criterion(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))  # expect: AG118
        return (loss, outputs) if return_outputs else loss


args = Seq2SeqTrainingArguments(output_dir="t5", per_device_train_batch_size=8, gradient_accumulation_steps=4)
SmoothedTrainer(model=model, args=args, train_dataset=train_ds).train()
