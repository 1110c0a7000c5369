# corpus: style=accelerate class=OK
# actor-critic: one accumulate() over both models, each optimizer stepped and cleared right
# after its own backward (the policy's clear precedes the value's backward: other parameters)
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
policy, value, policy_opt, value_opt, loader = accelerator.prepare(policy, value, policy_opt, value_opt, loader)
for s, a, r in loader:
    with accelerator.accumulate(policy, value):
        accelerator.backward(policy_loss(s, a, r))
        policy_opt.step()
        policy_opt.zero_grad()
        accelerator.backward(value_loss(s, r))
        value_opt.step()
        value_opt.zero_grad()
