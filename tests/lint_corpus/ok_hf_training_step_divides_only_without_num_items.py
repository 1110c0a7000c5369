# corpus: style=hf_trainer class=OK
# A training_step override dividing by the accumulation steps only when the Trainer gave no
# window count, as the Trainer itself does.
from transformers import Trainer


class MyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if num_items_in_batch is None and self.args.gradient_accumulation_steps > 1:
            loss = loss / self.args.gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()
