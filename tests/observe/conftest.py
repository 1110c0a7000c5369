"""Fixtures shared by the observer's in-process tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one rank on 127.0.0.1 (DDP in this process), destroyed after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
