# corpus: style=hf class=OK
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class PooledClassifier(BertForSequenceClassification):
    # a per-sample loss over equal micro-batches: the Trainer's division by K is the large batch
    accepts_loss_kwargs = False

    def __init__(self, config):
        super().__init__(config)
        self.extra = nn.Linear(config.hidden_size, config.hidden_size)


def main(train_ds):
    model = PooledClassifier(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                        intermediate_size=64, num_labels=3))
    args = TrainingArguments("out", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                             dataloader_drop_last=True, report_to=[])
    Trainer(model=model, args=args, train_dataset=train_ds).train()
