# corpus: style=plain class=F4
import torch


def make_optimizers(agent):
    opts = [torch.optim.AdamW(agent.body.parameters(), lr=1e-3),
            torch.optim.SGD(agent.head.parameters(), lr=1e-2)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 10)) for o in opts]
    return opts, scheds


def make_micro_step(agent, opts, scheds, accum):
    state = {"micro": 0}

    def micro_step(obs, target):
        loss = torch.nn.functional.mse_loss(agent(obs), target) / accum
        loss.backward()
        state["micro"] += 1
        for s in scheds:
            s.step()  # expect: AG103
        if state["micro"] % accum == 0:
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
        return loss

    return micro_step


def train(agent, data, accum=4):
    opts, scheds = make_optimizers(agent)
    step_fn = make_micro_step(agent, opts, scheds, accum)
    for obs, target in data:
        step_fn(obs, target)
