"""Parameters DDP never registered (blind round 95 a_b01): Accelerate prepares the model
(DDP, find_unused_parameters=True), then the script replaces the classifier head through
``unwrap_model``; the new head's parameters are in the module and the optimizer, but not
among those DDP registered when it was built, so their gradients are never averaged. The
observer compared the optimizer's parameters with the module's current ones and found none
outside: the generic F11. It now compares with DDP's registered parameters: F10 naming the
head (on the run's recording, 2 gloo ranks, first five steps); the twin that replaces the
head before ``prepare()`` is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_head_replaced_after_prepare_is_f10() -> None:
    errors = [f for f in judge_recorded("r95_head_replaced_after_prepare") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "parameters DDP does not reduce" in errors[0].title
    assert "head" in errors[0].evidence
    assert "before accelerator.prepare" in errors[0].fix


def test_head_replaced_before_prepare_is_silent() -> None:
    findings = judge_recorded("r95_head_replaced_before_prepare")
    assert not [f for f in findings if f.severity == "error"], findings


def test_the_observer_reads_the_parameters_ddp_registered() -> None:
    """In process, a one-rank group on an in-memory store: a head replaced after DDP was
    built is in the module but not among DDP's registered parameters; a module's ignored
    parameter is left out too; an object without DDP's list falls back to its parameters."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.observe._loose import _registered

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        ddp = DDP(net)
        before = {id(p) for p in _registered(ddp)}
        assert before == {id(p) for p in net.parameters()}
        net[1] = torch.nn.Linear(4, 2)  # replaced after DDP registered its parameters
        after = {id(p) for p in _registered(ddp)}
        assert not after & {id(p) for p in net[1].parameters()}
        assert {id(p) for p in net[0].parameters()} <= after
        plain = torch.nn.Linear(2, 2)
        assert {id(p) for p in _registered(plain)} == {id(p) for p in plain.parameters()}
    finally:
        dist.destroy_process_group()
