# corpus: style=plain class=F1
import torch
import torch.nn.functional as F

CONFIG = {"accum": 3, "steps": 6}


def make_trainer(model, master, opt):
    params = list(model.parameters())

    def micro(x, y, scale):
        loss = F.cross_entropy(model(x), y) * scale
        loss.backward()

    @torch.no_grad()
    def step():
        for m, p in zip(master, params):
            m.grad = p.main_grad.clone()
        opt.step()  # expect: AG101
        for m, p in zip(master, params):
            p.copy_(m)
            p.main_grad.zero_()
            m.grad = None

    return micro, step


def train(model, master, opt, data):
    micro, step = make_trainer(model, master, opt)
    K = CONFIG["accum"]
    for i, (x, y) in enumerate(data):
        micro(x, y, 1.0 / K)
        step()


def reference(model, master, opt, data):
    micro, step = make_trainer(model, master, opt)
    K = CONFIG["accum"]
    for s in range(CONFIG["steps"]):
        xs = torch.cat([data[s * K + j][0] for j in range(K)])
        ys = torch.cat([data[s * K + j][1] for j in range(K)])
        micro(xs, ys, 1.0)
        step()
