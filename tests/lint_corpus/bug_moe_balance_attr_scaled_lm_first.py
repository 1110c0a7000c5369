# corpus: style=trainer_class class=LOSS_SCALE
class MoETrainer:
    def __init__(self, model, optimizer, accumulation_steps, balance_coef=0.01):
        self.model, self.optimizer = model, optimizer
        self.accumulation_steps, self.balance_coef = accumulation_steps, balance_coef

    def run(self, batches):
        for idx, batch in enumerate(batches):
            outputs = self.model(**batch)
            main = outputs.loss / self.accumulation_steps
            balance = self.balance_coef * outputs.load_balancing_loss  # expect: AG127
            objective = main + balance
            objective.backward()
            if (idx + 1) % self.accumulation_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
