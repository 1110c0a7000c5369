"""Engine facts about communication, in one place: which functions each library issues its
collectives through, and which of them reduce gradients. The engine adapters count with
them, the observation layer wraps them, the benchmarks tally them (pure data, no imports).
"""

from __future__ import annotations

__all__ = ["DS_COMM_MODULES", "DS_OTHER_OPS", "DS_REDUCE_OPS", "OWN_COMM_MODULE",
           "OWN_OTHER_OPS", "OWN_REDUCE_OPS", "TORCH_OTHER_OPS", "TORCH_REDUCE_OPS"]

#: torch.distributed functions that reduce; FSDP2 (torch >= 2.13) issues its reduce-scatters
#: and all-gathers through the ``*_single`` names
TORCH_REDUCE_OPS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
                    "_reduce_scatter_base", "all_reduce_coalesced", "reduce_scatter_single")
#: torch.distributed functions that move data without reducing it
TORCH_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "_all_gather_base", "broadcast",
                   "all_to_all", "all_to_all_single", "barrier", "all_gather_object",
                   "all_gather_single")
#: deepspeed.comm's gradient reductions, looked up at call time (its torch backend bypasses
#: torch.distributed.reduce_scatter_tensor); all_to_all_single is the quantized (qgZ)
#: reduction, which coalesced_collectives imports by name
DS_REDUCE_OPS = ("all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce",
                 "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_fn",
                 "all_to_all_single")
#: deepspeed.comm's gathers and broadcasts (ZeRO-3 parameter gathers, the post-step
#: all-gather of updated partitions in ZeRO-1/2)
DS_OTHER_OPS = ("all_gather", "all_gather_into_tensor", "allgather_fn", "all_gather_coalesced",
                "broadcast", "barrier")
#: the modules through which DeepSpeed reaches those functions (each imported them by name)
DS_COMM_MODULES = ("deepspeed.comm", "deepspeed.comm.comm",
                   "deepspeed.runtime.comm.coalesced_collectives")
#: accumguard's own gradient reduction (gloo, 2 ranks, :mod:`accumguard.engines._pair`),
#: issued where FSDP2's or DeepSpeed ZeRO-3's reduce-scatter would be, through point-to-point
#: sends that no collective function sees; its callers look it up on that module at call time
OWN_COMM_MODULE = "accumguard.engines._pair"
OWN_REDUCE_OPS = ("reduce_scatter_pair",)
#: and its 2-rank in-place all-gather (DeepSpeed ZeRO-3's coalesced parameter gather)
OWN_OTHER_OPS = ("all_gather_pair",)
