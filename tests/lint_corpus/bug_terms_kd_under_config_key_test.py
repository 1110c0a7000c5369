# corpus: style=ddp class=LOSS_SCALE
# a distillation term added after the division by K, under a test of a config entry:
# it weighs K times its weight
import torch.nn.functional as F


def train(student, teacher, loader, opt, cfg):
    for step, (x, y) in enumerate(loader):
        is_boundary = (step + 1) % cfg["accum_steps"] == 0
        s_logits = student(x)
        loss = F.cross_entropy(s_logits, y) / cfg["accum_steps"]
        if cfg["kd_weight"] > 0:
            kd = F.kl_div(F.log_softmax(s_logits, -1), F.softmax(teacher(x), -1), reduction="batchmean")
            loss = loss + cfg["kd_weight"] * kd  # expect: AG127
        loss.backward()
        if is_boundary:
            opt.step()
            opt.zero_grad()
    opt.zero_grad()
