# corpus: style=hand_loop class=F4
# Mean teacher: the teacher's update was left after each backward when the loop grew a
# micro-step loop.
import torch
import torch.nn.functional as F


@torch.no_grad()
def update_teacher(teacher, student, decay):
    for tp, sp in zip(teacher.parameters(), student.parameters()):
        tp.mul_(decay).add_(sp.detach(), alpha=1 - decay)


def consistency(student, teacher, x, y):
    with torch.no_grad():
        target = F.softmax(teacher(x), -1)
    out = student(x)
    return F.cross_entropy(out, y) + F.mse_loss(F.softmax(out, -1), target)


def train(student, teacher, opt, batches, k):
    for step, window in enumerate(batches):
        for j in range(k):
            x, y = window[j]
            (consistency(student, teacher, x, y) / k).backward()
            update_teacher(teacher, student, 0.99)  # expect: AG158
        opt.step()
        opt.zero_grad()
