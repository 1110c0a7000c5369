# corpus: style=hf_trainer class=OK
# A training_step override dividing by the accumulation steps only when the Trainer gave no
# window count. The Trainer divides by the window's own count there
# (current_gradient_accumulation_steps): dividing by the configured K scales an epoch's short
# last window as if full, which lint warns about (AG334).
from transformers import Trainer


class MyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if num_items_in_batch is None and self.args.gradient_accumulation_steps > 1:
            loss = loss / self.args.gradient_accumulation_steps  # expect: AG334
        self.accelerator.backward(loss)
        return loss.detach()
