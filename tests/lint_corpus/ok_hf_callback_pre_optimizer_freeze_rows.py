# corpus: style=hf class=OK
# the same row freeze done right: on_pre_optimizer_step sees the window's whole gradient once;
# on_substep_end only reads gradients (a norm for logging), which changes nothing
from transformers import Trainer, TrainerCallback, TrainingArguments

N_OLD = 32000


class FreezePretrainedRows(TrainerCallback):
    def __init__(self):
        self.norms = []

    def on_substep_end(self, args, state, control, model=None, **kwargs):
        w = model.get_input_embeddings().weight
        if w.grad is not None:
            self.norms.append(w.grad[N_OLD:].norm().item())

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        w = model.get_input_embeddings().weight
        if w.grad is not None:
            w.grad[:N_OLD] = 0.0


args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                         gradient_accumulation_steps=8, learning_rate=2e-4)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[FreezePretrainedRows()])
trainer.train()
