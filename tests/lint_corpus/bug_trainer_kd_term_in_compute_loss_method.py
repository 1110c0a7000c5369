# corpus: style=trainer class=LOSS_SCALE
"""A distillation trainer: the loss is built in a method the window calls (returned with a
detached copy for logging); the cross-entropy is divided by K there, the KD term, added when
a teacher is given, is not: over the window it weighs K times its coefficient."""
import torch
import torch.nn.functional as F


class Distiller:
    def __init__(self, student, teacher, args):
        self.student, self.teacher, self.args = student, teacher, args
        self.opt = torch.optim.AdamW(student.parameters(), lr=args.lr)

    def compute_loss(self, inputs, targets):
        logits = self.student(inputs)
        ce = F.cross_entropy(logits, targets)
        loss = ce / self.args.grad_accum
        if self.teacher is not None:
            with torch.no_grad():
                t_logits = self.teacher(inputs)
            kd = F.kl_div(F.log_softmax(logits, -1), F.softmax(t_logits, -1), reduction="batchmean")
            loss = loss + self.args.kd_weight * kd  # expect: AG127
        return loss, ce.detach()

    def train_step(self, batches):
        for micro in range(self.args.grad_accum):
            inputs, targets = batches[micro]
            loss, ce = self.compute_loss(inputs, targets)
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
