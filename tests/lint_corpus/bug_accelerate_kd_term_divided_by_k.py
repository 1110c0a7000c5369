# corpus: style=accelerate class=LOSS_SCALE
# knowledge distillation under accumulate(): the KD term is divided by K by hand, then the
# loss goes to accelerator.backward, which divides the whole loss by K again
import torch.nn.functional as F
from accelerate import Accelerator

ACCUM = 8
acc = Accelerator(gradient_accumulation_steps=ACCUM)
student, teacher, opt, loader = acc.prepare(student, teacher, opt, loader)
for x, y in loader:
    with acc.accumulate(student):
        s_logits = student(x)
        t_logits = teacher(x).detach()
        distill = F.kl_div(F.log_softmax(s_logits, -1), F.log_softmax(t_logits, -1),
                           log_target=True, reduction="batchmean")
        distill = distill / ACCUM  # expect: AG121
        total = 0.5 * distill + 0.5 * F.cross_entropy(s_logits, y)
        acc.backward(total)
        opt.step()
        opt.zero_grad()
