# corpus: style=hf_trainer class=LOSS_SCALE
# A training_step override kept from transformers 4.3x: it divides by the accumulation steps
# the loss compute_loss already normalised by num_items_in_batch.
from transformers import Trainer


class MyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if self.args.gradient_accumulation_steps > 1:
            loss = loss / self.args.gradient_accumulation_steps  # expect: AG136, AG334
        self.accelerator.backward(loss)
        return loss.detach()
