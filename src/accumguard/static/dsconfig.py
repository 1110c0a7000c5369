"""Pure-Python checks of a DeepSpeed config for gradient-accumulation mistakes.

Used two ways: by ``accumguard check-config`` on a file, and by the DeepSpeed
engine adapter at construction time on the dict it is about to hand to
``deepspeed.initialize``. It therefore imports nothing but the standard
library (never ``deepspeed`` itself) and never raises for a *questionable*
config — it returns :class:`~accumguard.static.findings.Finding` objects and lets
the caller decide. It raises :class:`ConfigParseError` only when the text is
not a config at all.

Facts encoded here (checked against DeepSpeed 0.19.8):

* ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps
  * world_size``; given two of the three, DeepSpeed derives the third with
  integer division (so a non-divisible pair fails later with an assertion);
  given only one of the batch sizes, GA is 1.
* ``gradient_clipping`` defaults to 1.0: an unset key clips.
* With bf16/fp16 and GA > 1 the accumulation buffer is low precision unless
  ``data_types.grad_accum_dtype`` is ``"fp32"``.
* ZeRO-2/3 reduce gradients on every micro-step when GA > 1.

Configs are read by :mod:`accumguard.static._dsparse` (re-exported here) exactly
as DeepSpeed reads them: hjson, duplicate keys refused, original lines kept.

Size (~550 lines): the DeepSpeed config rules (AG2xx) are a table of small checks that share one resolved view of the config; they stay together.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import replace

from accumguard.core.errors import ConfigError
from accumguard.core.precision import f12_error_k
from accumguard.static._dsparse import (
    MAX_BYTES,
    MAX_DEPTH,
    UNKNOWN,
    ConfigDict,
    ConfigParseError,
    load_config,
    parse_config_text,
)
from accumguard.static.findings import RULES, Finding, Severity, lint_finding

__all__ = [
    "ConfigDict",
    "ConfigParseError",
    "MAX_BYTES",
    "MAX_DEPTH",
    "UNKNOWN",
    "check_config",
    "ignored_accumulation",
    "load_config",
    "managed_accumulation",
    "parse_config_text",
    "resolved_accumulation_steps",
    "zero_stage",
]

AUTO = "auto"
UNKNOWN_MARK = "<unknown>"  # a batch value computed in the script (see UNKNOWN)


# --------------------------------------------------------------------------- helpers

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# Top-level keys DeepSpeed (0.19) reads; used only to avoid calling a real key misspelled.
_KNOWN_TOP = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "managed_gradient_accumulation", "optimizer", "scheduler", "fp16", "bf16", "bfloat16",
        "amp", "torch_autocast", "gradient_clipping", "zero_optimization",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
        "wall_clock_breakdown", "memory_breakdown", "dump_state", "prescale_gradients",
        "gradient_predivide_factor", "gradient_allreduce_op", "communication_data_type",
        "seq_parallel_communication_data_type", "data_types", "sparse_gradients",
        "disable_allgather", "disable_python_gc", "dataloader_drop_last", "activation_checkpointing",
        "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config",
        "comms_logger", "checkpoint", "aio", "elasticity", "pipeline", "curriculum_learning",
        "data_efficiency", "compression_training", "autotuning", "hybrid_engine", "nebula",
        "weight_quantization", "compile", "timers", "use_data_before_expert_parallelism",
        "data_parallel_group", "global_rank", "log_level", "sparse_attention", "quantize_training",
        "eigenvalue", "progressive_layer_drop", "graph_harvesting", "tensor_parallel",
        "sequence_parallel_size",
    }
)

# Keys where a typo silently changes accumulation, clipping or precision, per section.
_RELEVANT: dict[tuple[str, ...], tuple[str, ...]] = {
    (): (
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "data_types", "zero_optimization", "bf16", "fp16",
        "prescale_gradients", "gradient_predivide_factor", "communication_data_type",
    ),
    ("zero_optimization",): (
        "stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
        "allgather_partitions", "allgather_bucket_size", "offload_optimizer", "offload_param",
        "round_robin_gradients", "sub_group_size", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
        "use_multi_rank_bucket_allreduce", "load_from_fp32_weights", "elastic_checkpoint",
        "ignore_unused_parameters", "legacy_stage1", "cpu_offload", "zero_hpz_partition_size",
        "zero_quantized_weights", "zero_quantized_gradients", "mics_shard_size",
        "compute_grad_norm", "prefetch_bucket_size", "param_persistence_threshold",
        "model_persistence_threshold", "max_live_parameters", "max_reuse_distance",
        "gather_16bit_weights_on_model_save", "stage3_model_persistence_threshold",
        "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
        "log_trace_cache_warnings", "enable_sanity_checks", "mics_hierarchical_params_gather",
        "zero_quantized_nontrainable_weights", "parameter_alignment", "leaf_module",
        "module_granularity_threshold", "use_all_reduce_for_fetch_params",
        "stage3_use_all_reduce_for_fetch_params", "allgather_sequential",
        "stage3_allgather_sequential", "stage3_module_granularity_threshold",
        "stage3_gather_fp16_weights_on_model_save", "cpu_offload_param",
        "cpu_offload_use_pin_memory", "zenflow", "save_muon_momentum_buffer_in_memory",
    ),
    ("data_types",): ("grad_accum_dtype", "param_dtype", "buffer_dtype", "keep_in_fp32_modules"),
    ("bf16",): (
        "enabled", "immediate_grad_update", "check_overflow", "bf16_master_weights_and_grads",
        "bf16_optimizer_states", "loss_scale", "auto_cast",
    ),
    ("fp16",): (
        "enabled", "loss_scale", "auto_cast", "initial_scale_power", "loss_scale_window",
        "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
        "type",
    ),
}
# Only these are *suggested* for typos (so a typo of e.g. a monitor key is not our business).
_SUGGEST: dict[tuple[str, ...], tuple[str, ...]] = {
    (): (
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "gradient_clipping", "data_types", "zero_optimization", "bf16", "fp16",
        "prescale_gradients", "gradient_predivide_factor", "communication_data_type",
    ),
    ("zero_optimization",): ("stage", "overlap_comm", "contiguous_gradients", "reduce_scatter",
                             "reduce_bucket_size"),
    ("data_types",): ("grad_accum_dtype",),
    ("bf16",): ("enabled",),
    ("fp16",): ("enabled",),
}
_ACCUM_WORDS = re.compile(r"accum|batch|clip|grad", re.IGNORECASE)


def _get(cfg: Mapping[str, object], *path: str) -> object:
    node: object = cfg
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _has(cfg: Mapping[str, object], *path: str) -> bool:
    node: object = cfg
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _positive_int(value: object) -> int | None:
    """An int (or integral float/str, as hjson users write them) > 0, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def _enabled(section: object) -> bool:
    if isinstance(section, Mapping):
        v = section.get("enabled", False)
        # "auto" (Hugging Face) may or may not enable it: not counted, to avoid guessing
        return v is True or (isinstance(v, str) and v.lower() == "true")
    return section is True


def resolved_accumulation_steps(
    cfg: Mapping[str, object], *, world_size: int | None = None
) -> int | None:
    """The gradient_accumulation_steps DeepSpeed will use, or ``None`` when it cannot be known.

    Mirrors DeepSpeed's derivation: explicit value wins; with train_batch_size
    and the micro batch it is ``tbs // (micro * W)`` (needs ``world_size``);
    with only one batch size given it is 1. ``"auto"`` values give ``None``.
    """
    ga = cfg.get("gradient_accumulation_steps")
    if ga is not None:
        return _positive_int(ga)
    tbs = cfg.get("train_batch_size")
    micro = cfg.get("train_micro_batch_size_per_gpu")
    if AUTO in (tbs, micro) or UNKNOWN in (tbs, micro):
        return None
    if getattr(cfg, "partial", False):
        return None  # GA may hide in the part we cannot see
    tbs_i, micro_i = _positive_int(tbs), _positive_int(micro)
    if tbs_i is not None and micro_i is not None:
        if world_size is None:
            return None
        return tbs_i // (micro_i * world_size) or None
    if tbs_i is not None or micro_i is not None:
        return 1
    return None


def zero_stage(cfg: Mapping[str, object]) -> int | None:
    """The ZeRO stage DeepSpeed will use (0 when the key is absent), None when unknown."""
    if getattr(cfg, "partial", False) and "zero_optimization" not in cfg:
        return None
    section = cfg.get("zero_optimization")
    if section is None:
        return 0
    if not isinstance(section, Mapping):
        return None
    stage = section.get("stage", 0)
    if isinstance(stage, bool):
        return None
    if isinstance(stage, int) and 0 <= stage <= 3:
        return stage
    if isinstance(stage, str) and stage.strip() in ("0", "1", "2", "3"):
        return int(stage)
    return None


def managed_accumulation(cfg: Mapping[str, object]) -> bool | None:
    """``managed_gradient_accumulation`` (DeepSpeed default True; False makes every
    ``step()`` the boundary, so a hand-gated loop is right). None when unknown."""
    if "managed_gradient_accumulation" not in cfg:
        return None if getattr(cfg, "partial", False) else True
    v = cfg["managed_gradient_accumulation"]
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


# --------------------------------------------------------------------------- checks


class _Collector:
    """Builds findings with the rule's severity/fix and the key's line."""

    def __init__(self, cfg: Mapping[str, object]) -> None:
        self.cfg = cfg
        self.lines: dict[tuple[str, ...], int] = getattr(cfg, "key_lines", {}) or {}
        self.path: str | None = getattr(cfg, "source", None)
        self.findings: list[Finding] = []

    def add(
        self,
        code: str,
        message: str,
        *,
        key: tuple[str, ...] = (),
        fix: str | None = None,
        severity: Severity | None = None,
    ) -> None:
        rule = RULES[code]
        line = None
        # point at the key, or the closest enclosing key that exists
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                line = self.lines[key[:n]]
                break
        self.findings.append(
            lint_finding(
                code,
                message,
                severity=severity,
                fix=fix or rule.fix,
                key=".".join(key) or None,
                line=line,
                col=1 if line is not None else None,
                path=self.path,
            )
        )


def _check_values(c: _Collector) -> dict[str, int | str | None]:
    """Validate the three batch values; return them as int, ``"auto"`` or ``None`` (absent/invalid)."""
    vals: dict[str, int | str | None] = {}
    for key in _BATCH_KEYS:
        if key not in c.cfg:
            vals[key] = None
            continue
        raw = c.cfg[key]
        if raw is UNKNOWN:
            vals[key] = UNKNOWN_MARK
            continue
        if raw == AUTO:
            vals[key] = AUTO
            continue
        v = _positive_int(raw)
        if v is None:
            c.add(
                "AG200",
                f"`{key}` is {raw!r}; expected a positive integer (or \"auto\" with the Hugging Face "
                "Trainer)",
                key=(key,),
            )
        vals[key] = v
    return vals


def _check_arithmetic(
    c: _Collector, vals: dict[str, int | str | None], world_size: int | None
) -> None:
    tbs, micro, ga = (vals[k] for k in _BATCH_KEYS)
    if UNKNOWN_MARK in (tbs, micro, ga):
        return  # computed in the script: nothing to check statically
    if AUTO in (tbs, micro, ga):
        autos = [k for k in _BATCH_KEYS if vals[k] == AUTO]
        c.add(
            "AG207",
            f"{', '.join('`' + k + '`' for k in autos)} {'is' if len(autos) == 1 else 'are'} \"auto\": "
            "the Hugging Face Trainer fills them from TrainingArguments (per_device_train_batch_size, "
            "gradient_accumulation_steps); plain deepspeed.initialize rejects \"auto\"",
            key=(autos[0],),
        )
        return
    present = {k: v for k, v in zip(_BATCH_KEYS, (tbs, micro, ga), strict=True) if isinstance(v, int)}
    if not any(k in c.cfg for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        if getattr(c.cfg, "partial", False):
            return
        c.add(
            "AG201",
            "neither `train_batch_size` nor `train_micro_batch_size_per_gpu` is set; DeepSpeed "
            "needs at least one of them to know the batch",
            fix="set train_micro_batch_size_per_gpu and gradient_accumulation_steps "
            "(DeepSpeed derives train_batch_size = micro x GA x world size)",
        )
        return
    if isinstance(tbs, int) and isinstance(micro, int) and isinstance(ga, int):
        per_rank = micro * ga
        if world_size is not None:
            if tbs != per_rank * world_size:
                c.add(
                    "AG201",
                    f"train_batch_size ({tbs}) != train_micro_batch_size_per_gpu ({micro}) x "
                    f"gradient_accumulation_steps ({ga}) x world size ({world_size}) = "
                    f"{per_rank * world_size}; DeepSpeed refuses to start",
                    key=("train_batch_size",),
                    fix=f"set train_batch_size to {per_rank * world_size}, or remove it and let "
                    "DeepSpeed derive it",
                )
        elif tbs % per_rank != 0:
            c.add(
                "AG201",
                f"train_batch_size ({tbs}) is not a multiple of train_micro_batch_size_per_gpu "
                f"({micro}) x gradient_accumulation_steps ({ga}) = {per_rank}: no world size "
                "satisfies train_batch_size = micro x GA x W",
                key=("train_batch_size",),
                fix="remove train_batch_size and let DeepSpeed derive it from micro x GA x W",
            )
        return
    if world_size is None:
        return
    # two of three given: DeepSpeed derives the third with integer division; check it is exact
    if isinstance(tbs, int) and isinstance(micro, int) and "gradient_accumulation_steps" not in present:
        if tbs % (micro * world_size) != 0:
            c.add(
                "AG201",
                f"gradient_accumulation_steps is derived as train_batch_size ({tbs}) / "
                f"(micro {micro} x world size {world_size}), which is not an integer; DeepSpeed "
                "truncates it and then fails its batch assertion",
                key=("train_batch_size",),
                fix="make train_batch_size a multiple of micro x world size, or set "
                "gradient_accumulation_steps explicitly instead of train_batch_size",
            )
    elif isinstance(tbs, int) and isinstance(ga, int) and tbs % (ga * world_size) != 0:
        c.add(
            "AG201",
            f"train_micro_batch_size_per_gpu is derived as train_batch_size ({tbs}) / (GA {ga} x "
            f"world size {world_size}), which is not an integer",
            key=("train_batch_size",),
            fix="make train_batch_size a multiple of GA x world size, or set "
            "train_micro_batch_size_per_gpu explicitly",
        )


def _check_ga_vs_loop(
    c: _Collector,
    vals: dict[str, int | str | None],
    *,
    world_size: int | None,
    accumulation_steps: int | None,
    coalesced: bool,
) -> None:
    if accumulation_steps is None or vals["gradient_accumulation_steps"] == AUTO:
        return
    ga = resolved_accumulation_steps(c.cfg, world_size=world_size)
    if ga is None:
        return
    ga_desc = (
        f"gradient_accumulation_steps is {ga}"
        if "gradient_accumulation_steps" in c.cfg
        else f"gradient_accumulation_steps is absent (so DeepSpeed uses {ga})"
    )
    if coalesced:
        if ga != 1:
            c.add(
                "AG202",
                f"{ga_desc} but the loop coalesces {accumulation_steps} backwards per step(): the "
                "engine then waits for GA step() calls and steps every "
                f"{accumulation_steps * ga} micro-batches",
                key=("gradient_accumulation_steps",),
                fix="set gradient_accumulation_steps to 1 when you wrap the K backwards in "
                "engine.coalesce_grad_reduction() and call step() once",
            )
        return
    if ga == accumulation_steps:
        return
    if ga == 1 and accumulation_steps > 1:
        msg = (
            f"{ga_desc} but the loop accumulates {accumulation_steps} micro-batches per step: "
            "the engine treats every backward as a boundary, and ZeRO-1/2 then train on the last "
            "micro-batch only"
        )
    else:
        msg = (
            f"{ga_desc} but the loop accumulates {accumulation_steps} micro-batches per step: "
            "the engine's boundary and the loop's disagree"
        )
    c.add(
        "AG202",
        msg,
        key=("gradient_accumulation_steps",),
        fix=f"set \"gradient_accumulation_steps\": {accumulation_steps} and call engine.backward() "
        "and engine.step() on every micro-batch (the engine gates the step); or keep 1 and wrap "
        "the K backwards in `with engine.coalesce_grad_reduction():`",
    )


def _effective_ga_for_costs(
    c: _Collector, vals: dict[str, int | str | None], world_size: int | None, k: int | None
) -> int | None:
    ga = resolved_accumulation_steps(c.cfg, world_size=world_size)
    if ga is None and vals["gradient_accumulation_steps"] == AUTO:
        return k
    return ga


_LOW_NAMES = {"bf16": ("bf16", "bfloat16"), "fp16": ("fp16", "float16", "half")}


def _check_precision_and_clipping(c: _Collector, ga: int | None) -> None:
    cfg = c.cfg
    partial = getattr(cfg, "partial", False)
    if "gradient_clipping" not in cfg and not partial:
        c.add(
            "AG203",
            "`gradient_clipping` is not set, so DeepSpeed clips the global gradient norm at 1.0 "
            "at every step, whether or not the script clips too (a clip_grad_norm_ of its own "
            "at another norm does not replace the engine's)",
            key=("gradient_clipping",),
        )
    bf16 = _enabled(cfg.get("bf16")) or _enabled(cfg.get("bfloat16"))
    fp16 = _enabled(cfg.get("fp16"))
    if (bf16 or fp16) and ga is not None and ga > 1:
        dtype = _get(cfg, "data_types", "grad_accum_dtype")
        if dtype is UNKNOWN or (dtype is None and partial):
            return
        if dtype is None or (isinstance(dtype, str) and dtype.lower() not in ("fp32", "float32")):
            prec = "bf16" if bf16 else "fp16"
            seen = "is not set" if dtype is None else f"is {dtype!r}"
            # ZeRO-1/2 hand the model dtype to the optimizer as its accumulation dtype when
            # grad_accum_dtype is unset, and sum .grad and the gradient partitions in it
            low = dtype is None or (isinstance(dtype, str) and dtype.lower() in _LOW_NAMES[prec])
            stage = _positive_int(_get(cfg, "zero_optimization", "stage"))
            proven = low and stage in (1, 2) and ga >= f12_error_k()
            c.add(
                "AG204",
                f"{prec} is enabled with gradient_accumulation_steps {ga} and "
                f"`data_types.grad_accum_dtype` {seen}: {ga} micro-gradients are summed in "
                f"{prec}, and the rounding error grows with the number of micro-steps"
                + (f" (ZeRO stage {stage} sums them in {prec}: "
                   f"an error from K >= {f12_error_k()}, where the expected drift u*sqrt(K)/3 "
                   "is a measurable share of the update's error; the large batch sums in fp32)" if proven else ""),
                key=("data_types", "grad_accum_dtype") if dtype is not None else (prec,),
                severity=Severity.ERROR if proven else None,
            )


def _check_zero_costs(c: _Collector, ga: int | None) -> None:
    stage_raw = _get(c.cfg, "zero_optimization", "stage")
    stage = _positive_int(stage_raw) if stage_raw is not None else None
    if stage not in (2, 3) or ga is None or ga <= 1:
        return
    if _has(c.cfg, "zero_optimization", "overlap_comm") or getattr(c.cfg, "partial", False):
        return
    c.add(
        "AG205",
        f"ZeRO stage {stage} with gradient_accumulation_steps {ga} reduces gradients on each of the "
        f"{ga} micro-steps ({ga} reductions per optimizer step) and `overlap_comm` is not chosen",
        key=("zero_optimization", "stage"),
    )


def _check_keys(c: _Collector) -> None:
    for section, known in _RELEVANT.items():
        node = _get(c.cfg, *section) if section else c.cfg
        if not isinstance(node, Mapping):
            continue
        known_all = _KNOWN_TOP if not section else frozenset(known)
        suggest = _SUGGEST[section]
        for key in node:
            if not isinstance(key, str) or key in known_all or key in known:
                continue
            match = difflib.get_close_matches(key, suggest, n=1, cutoff=0.75)
            if not match and not (section == () and _ACCUM_WORDS.search(key)):
                continue
            where = ".".join((*section, key))
            if match:
                target = ".".join((*section, match[0]))
                msg = f"unknown key `{where}`: did you mean `{target}`?"
                if match[0] in node:
                    msg += f" (`{target}` is also set; this one is ignored)"
                fix = f"rename `{where}` to `{target}`"
            else:
                msg = (
                    f"unknown key `{where}` looks accumulation-related but DeepSpeed does not read it"
                )
                fix = "remove it or use one of: " + ", ".join(suggest[:4])
            cls = _misspelled_class(c.cfg, section, match[0] if match else None, node)
            ignored = ignored_accumulation(c.cfg) if section == () else None
            if ignored is not None and ignored[0] == key:
                # the script asked for K > 1 under a key DeepSpeed never reads: the engine
                # runs gradient_accumulation_steps = 1, every engine.step() steps
                cls = "F1"
                msg += (f"; with no `gradient_accumulation_steps` nor `train_batch_size`, DeepSpeed "
                        f"runs an accumulation of 1, not {ignored[1]}: every `engine.step()` steps")
                fix = f"name it `gradient_accumulation_steps` ({key} = {ignored[1]} is ignored)"
            clip = ignored_clip(c.cfg) if section == () else None
            if clip is not None and clip[0] == key:
                # a clip value written under a key DeepSpeed never reads: the engine clips
                # at its default 1.0, not at the value the script chose
                cls = "F9"
                meant = "no clipping" if clip[1] == 0 else f"a clip at {clip[1]:g}"
                msg = (f"unknown key `{key}`: DeepSpeed does not read it, and with no "
                       f"`gradient_clipping` it clips every update at its default norm 1.0, "
                       f"not {meant} as `{key}: {clip[1]!r}` asks")
                fix = f"name it `gradient_clipping` ({key} = {clip[1]!r} is ignored)"
            proven = (ignored is not None and ignored[0] == key) or \
                (clip is not None and clip[0] == key)
            c.add("AG206", msg, key=(*section, key), fix=fix,
                  severity=Severity.ERROR if proven else None)
            if cls:
                c.findings[-1] = replace(c.findings[-1], cls=cls)


def ignored_accumulation(cfg: Mapping[str, object]) -> tuple[str, int] | None:
    """(key, K) when the config asks for K > 1 under a top-level key DeepSpeed does not read
    (``gradient_accumulation_step``, Lightning's ``accumulate_grad_batches``) and sets neither
    ``gradient_accumulation_steps`` nor ``train_batch_size``: DeepSpeed then runs an
    accumulation of 1 and every ``engine.step()`` steps (F1). Read by lint (AG206 at error)
    and by ``watch`` from the config the engine was given."""
    if "gradient_accumulation_steps" in cfg or "train_batch_size" in cfg:
        return None
    for key, value in cfg.items():
        if not isinstance(key, str) or key in _KNOWN_TOP:
            continue
        close = difflib.get_close_matches(key, ["gradient_accumulation_steps"], n=1, cutoff=0.75)
        k = _positive_int(value)
        if (close or "accum" in key.lower()) and k is not None and k > 1:
            return key, k
    return None


_CLIP_WORDS = re.compile(r"clip|max_grad_norm|grad_norm", re.IGNORECASE)


def ignored_clip(cfg: Mapping[str, object]) -> tuple[str, float] | None:
    """(key, value) when the config writes a clip value other than DeepSpeed's default 1.0
    under a top-level key DeepSpeed does not read (``gradient_clip``, the HF Trainer's
    ``max_grad_norm``) and sets no ``gradient_clipping``: the engine clips every update at
    1.0, not at the value written (0: no clipping meant). Lint's AG206 at error (F9)."""
    if "gradient_clipping" in cfg:
        return None
    for key, value in cfg.items():
        if not isinstance(key, str) or key in _KNOWN_TOP or not _CLIP_WORDS.search(key):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and value >= 0 and value != 1.0:
            return key, float(value)
    return None


def _misspelled_class(cfg: Mapping[str, object], section: tuple[str, ...], meant: str | None,
                      node: Mapping[str, object]) -> str:
    """The failure a misspelled key causes when the key it meant is then absent: DeepSpeed's
    default clip at 1.0 (F9), or an accumulation of 1 with nothing else giving the window
    (no ``train_batch_size``): every ``engine.step()`` steps (F1)."""
    if section or meant is None or meant in node:
        return ""
    if meant == "gradient_clipping":
        return "F9"
    if meant == "gradient_accumulation_steps" and "train_batch_size" not in cfg:
        return "F1"
    return ""


def check_config(
    cfg: Mapping[str, object],
    *,
    world_size: int | None = None,
    accumulation_steps: int | None = None,
    coalesced: bool = False,
) -> list[Finding]:
    """Check a DeepSpeed config dict for accumulation mistakes.

    ``world_size`` (data-parallel ranks) enables the exact batch arithmetic;
    ``accumulation_steps`` is the number of micro-batches the *training loop*
    runs per optimizer step (compared with the config's GA); ``coalesced`` says
    the loop wraps those backwards in ``engine.coalesce_grad_reduction()`` and
    calls ``step()`` once, in which case the config's GA must be 1.

    Returns findings sorted by line; never raises for a questionable config.
    Raises :class:`~accumguard.core.errors.ConfigError` only for bad arguments.
    """
    for name, value in (("world_size", world_size), ("accumulation_steps", accumulation_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"`{name}` ({value!r}) must be a positive int or None")
    c = _Collector(cfg)
    vals = _check_values(c)
    _check_arithmetic(c, vals, world_size)
    _check_ga_vs_loop(
        c, vals, world_size=world_size, accumulation_steps=accumulation_steps, coalesced=coalesced
    )
    ga = _effective_ga_for_costs(c, vals, world_size, accumulation_steps)
    _check_precision_and_clipping(c, ga)
    _check_zero_costs(c, ga)
    _check_keys(c)
    return sorted(c.findings, key=lambda f: (f.line or 0, f.code or ""))

