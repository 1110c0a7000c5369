# corpus: style=hf class=OK
# Hugging Face Trainer-like: the inner loop calls training_step, which does one backward
import contextlib
import functools


class MiniTrainer:
    def inner_training_loop(self, model, epoch_iterator, args, steps_in_epoch):
        step = -1
        for _ in range(self.total_updates):
            batch_samples, num_items_in_batch = self.get_batch_samples(
                epoch_iterator, args.gradient_accumulation_steps
            )
            for i, inputs in enumerate(batch_samples):
                step += 1
                do_sync_step = (step + 1) % args.gradient_accumulation_steps == 0 or (
                    step + 1
                ) == steps_in_epoch
                context = (
                    functools.partial(self.accelerator.no_sync, model=model)
                    if i != len(batch_samples) - 1
                    else contextlib.nullcontext
                )
                with context():
                    self.training_step(model, inputs, num_items_in_batch)
                if do_sync_step:
                    self.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    self.optimizer.step()
                    self.lr_scheduler.step()
                    model.zero_grad()

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if num_items_in_batch is None:
            loss = loss / self.args.gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()
