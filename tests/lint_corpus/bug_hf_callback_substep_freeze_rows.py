# corpus: style=hf class=F3
# new-token fine-tuning: a callback keeps the pretrained vocabulary rows of the embedding fixed by
# zeroing their gradient in on_substep_end, which the Trainer never calls after the last
# micro-batch of a window, so that micro-batch still moves the "frozen" rows
from transformers import Trainer, TrainerCallback, TrainingArguments

N_OLD = 32000


def embedding_weights(model):
    return [p for n, p in model.named_parameters() if "embed_tokens" in n and p.requires_grad]


def keep_old_rows_(model):
    for w in embedding_weights(model):
        if w.grad is not None:
            w.grad[:N_OLD].zero_()  # expect: AG149


class FreezePretrainedRows(TrainerCallback):
    def on_substep_end(self, args, state, control, model=None, **kwargs):
        keep_old_rows_(model)


args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                         gradient_accumulation_steps=8, learning_rate=2e-4)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[FreezePretrainedRows()])
trainer.train()
