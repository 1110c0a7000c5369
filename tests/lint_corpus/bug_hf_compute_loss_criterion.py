# corpus: style=hf class=F5
# the training arguments come from the command line: whether GA > 1 is not in sight (a warning)
import torch.nn as nn
from transformers import HfArgumentParser, Seq2SeqTrainer, Seq2SeqTrainingArguments


class LabelSmoothedTrainer(Seq2SeqTrainer):
    def __init__(self, *args, smoothing=0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fct = nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=smoothing)

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        labels = inputs["labels"]
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
        loss = self.loss_fct(logits.view(-1, logits.size(-1)), labels.view(-1))  # expect: AG118
        return (loss, outputs) if return_outputs else loss


(training_args,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses()
LabelSmoothedTrainer(model=model, args=training_args, train_dataset=train_ds).train()
