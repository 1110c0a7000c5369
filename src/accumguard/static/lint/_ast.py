"""Small, pure AST helpers and the identifier patterns the lint rules share.

Kept apart from the rules so that each rule module reads as the decision it
makes, not as tree plumbing. Nothing here knows about findings.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
#: leaf singletons (Load, Add, And, Not, Eq...) no rule looks at: not walked
_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
_SKIP_LOCAL = SCOPES + _LEAVES
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)

#: identifiers that show accumulation is going on (``register_post_accumulate_grad_hook`` does not)
ACCUM_RE = re.compile(
    # (`micro_bs`, `micro_batch_size`: the size of one micro-batch, not how many there are)
    r"(?!micro_?(bs|bsz|batch_?size)$)"
    r"(grad(ient)?s?_?acc|(?<!post_)accum|micro_?(batch|step|bs)|n_?micro|num_?micro|_micro$|^micro"
    # fairseq's `--update-freq` (`args.update_freq`, `cfg["update_freq"]`); not a target
    # network's or an EMA's `*_update_freq`
    r"|^update_?freq$)"
)
#: identifiers that, in an ``if`` test, mean "this is the boundary"
BOUNDARY_RE = re.compile(
    r"last|boundary|sync|final|step_applied"  # (DeepSpeed's engine.was_step_applied())
    r"|(should|do|take|need|time_to|ready_to|is)_?(to_)?(step|update|optim|apply)"
    r"|(step|update|optim)_?now"
)
#: boundary names whose truth means "this *is* the boundary" (used for polarity)
POSITIVE_BOUNDARY_RE = re.compile(
    r"^(is_)?last|_last|boundary|sync_grad|should_sync|do_sync|final|ready|step_applied"
    r"|(should|do|take|need|time_to|ready_to|is)_?(to_)?(step|update|optim|apply)"
    r"|(step|update|optim)_?now"
)
OPTIM_RE = re.compile(r"optim|^opt(_|\d|$)|_opt(\d*)$|^o?pt?imi[sz]er")
SCHED_RE = re.compile(r"sched|^lr_?s|warmup")
ENGINE_RE = re.compile(r"engine")
SCALER_RE = re.compile(r"scaler")
WORLD_RE = re.compile(
    r"world|get_world_size|num_processes|nprocs|n_gpu|num_gpus|n_ranks|num_ranks|dp_size"
    r"|data_parallel_size"
)
#: identifiers of a per-micro-batch / per-rank count of valid tokens or samples
COUNT_RE = re.compile(r"tok|count|valid|mask|num_items|n_items|denom|n_label|num_label|nonpad")
#: a whole name that holds a count a loss may be normalised by (``n``, ``ntok``,
#: ``num_boxes``, ``window_count``, ``denom``): what a normaliser handed around is called
COUNT_NAME_RE = re.compile(r"^(n|n_\w+|\w+_n|num\w*|n?tok\w*|\w*count\w*|\w*tokens\w*|"
                           r"\w*total\w*|denom\w*|norm\w*|\w*items\w*|\w*samples\w*)$",
                           re.IGNORECASE)
#: identifiers that say a count covers the whole window or all ranks (the right normaliser)
GLOBAL_COUNT_RE = re.compile(r"global|total|window|all_?reduce|step_tok|per_step|batch_tok")
FRAMEWORK_BACKWARD = frozenset({"accelerator", "fabric", "self", "autograd", "torch", "amp"})
CLIP_FUNCS = frozenset(
    {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients", "clip_grad_value"}
)
UNSCALE_FUNCS = frozenset({"unscale_", "unscale_gradients"})
OPTIMIZER_CLASSES = frozenset(
    {"sgd", "adam", "adamw", "adagrad", "adadelta", "adamax", "nadam", "radam", "rmsprop", "lbfgs",
     "sparseadam", "adafactor", "lion", "lamb", "fusedadam", "deepspeedcpuadam", "adamw8bit",
     "paged_adamw", "muon", "optimizers", "configure_optimizers", "create_optimizer"}
)
#: torch's learning-rate scheduler classes (lower-cased), for names that do not say "sched"
#: (``self.plateau = ReduceLROnPlateau(opt)``)
SCHEDULER_CLASSES = frozenset(
    {"lambdalr", "multiplicativelr", "steplr", "multisteplr", "constantlr", "linearlr",
     "exponentiallr", "sequentiallr", "cosineannealinglr", "chainedscheduler", "reducelronplateau",
     "cycliclr", "onecyclelr", "cosineannealingwarmrestarts", "polynomiallr"}
)
#: the tensor being all-reduced is a gradient (not grad_input/grad_output of a custom autograd op)
GRAD_TENSOR_RE = re.compile(r"^(grad|grads|gradients?|flat_grads?|grad_buf\w*|grad_bucket\w*|\w+_grads?)$")
WINDOW_FUNCS = frozenset({"training_step", "train_step"})
DDP_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "fully_shard", "FullyShardedDataParallel", "FSDP"}
)


def dotted(node: ast.AST | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain; ``a.b()`` style calls give ``a.b()``; else None."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        elif isinstance(node, ast.Call) and not node.args and not node.keywords:
            inner = dotted(node.func)
            if inner is None:
                return None
            parts.append(inner + "()")
            return ".".join(reversed(parts))
        else:
            return None


def label(node: ast.AST) -> str:
    """The identifier a value is known by: a dotted name, or a subscript's string key
    (``batch["win_tokens"]``, ``cfg["warmup_tokens"]``); "" when it has none."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return label(node.value)
    return dotted(node) or ""


def last_part(name: str | None) -> str:
    """Last identifier of a dotted name, lower-cased (``self.optimizer`` -> ``optimizer``)."""
    if not name:
        return ""
    return name.rsplit(".", 1)[-1].rstrip("()").lower()


def identifiers(node: ast.AST) -> Iterator[str]:
    """Every identifier in ``node`` (names, attributes, args, keywords), lower-cased."""
    for sub in walk_all(node):
        if isinstance(sub, ast.Name):
            yield sub.id.lower()
        elif isinstance(sub, ast.Attribute):
            yield sub.attr.lower()
        elif isinstance(sub, ast.arg | ast.keyword) and sub.arg:
            yield sub.arg.lower()


def walk_all(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` (like :func:`ast.walk`, order aside, operator and context
    leaves skipped), without ast.walk's per-call import and deque: it is called on many
    small expressions."""
    stack = [node]
    pop, push = stack.pop, stack.append
    AST = ast.AST
    while stack:
        cur = pop()
        yield cur
        for name in cur._fields:
            v = getattr(cur, name, None)
            if isinstance(v, list):
                for item in v:
                    if isinstance(item, AST) and not isinstance(item, _LEAVES):
                        push(item)
            elif isinstance(v, AST) and not isinstance(v, _LEAVES):
                push(v)


def walk_local(node: ast.AST) -> Iterator[ast.AST]:
    """Like :func:`ast.walk` but does not enter nested function/class/lambda definitions."""
    stack = [node]
    pop, push = stack.pop, stack.append
    AST = ast.AST
    while stack:  # inlined iter_child_nodes: this generator is the linter's hot path
        cur = pop()
        yield cur
        for name in cur._fields:
            v = getattr(cur, name, None)
            if isinstance(v, list):
                for item in v:
                    if isinstance(item, AST) and not isinstance(item, _SKIP_LOCAL):
                        push(item)
            elif isinstance(v, AST) and not isinstance(v, _SKIP_LOCAL):
                push(v)


def local_identifiers(node: ast.AST) -> Iterator[str]:
    """:func:`identifiers` without entering nested scopes."""
    for sub in walk_local(node):
        if isinstance(sub, ast.Name):
            yield sub.id.lower()
        elif isinstance(sub, ast.Attribute):
            yield sub.attr.lower()
        elif isinstance(sub, ast.arg | ast.keyword) and sub.arg:
            yield sub.arg.lower()


#: calls that name values to show them, not to act on them
_REPORTS = frozenset({"print", "log", "info", "debug", "warning", "write", "set_postfix"})


def checks_or_reports(node: ast.AST) -> bool:
    """An ``assert`` or a print/log call: it names values without acting on them."""
    return isinstance(node, ast.Assert) or (
        isinstance(node, ast.Call) and (call_attr(node) or "") in _REPORTS)


def own_identifier(node: ast.AST) -> list[str]:
    """The one identifier a Name, Attribute, arg or keyword node itself carries, lower-cased
    (none for any other node)."""
    ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) \
        else node.arg if isinstance(node, ast.arg | ast.keyword) else None
    return [ident.lower()] if ident else []


def call_attr(call: ast.Call) -> str | None:
    """The method/function name of a call: ``x.y.step(...)`` -> ``step``, ``f(...)`` -> ``f``."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def receiver(call: ast.Call) -> ast.AST | None:
    """The object a method is called on (``a.b`` for ``a.b.step()``), None for a plain call."""
    return call.func.value if isinstance(call.func, ast.Attribute) else None


def is_backward(call: ast.Call) -> bool:
    """``x.backward(...)`` or Lightning's ``self.manual_backward(...)``."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("backward", "manual_backward")


def has_backward(stmts: list[ast.stmt]) -> bool:
    """A backward call anywhere in ``stmts``."""
    return any(isinstance(n, ast.Call) and is_backward(n) for stmt in stmts for n in walk_all(stmt))


def terminates(body: list[ast.stmt]) -> bool:
    """The block ends by leaving the iteration (continue/return/break/raise)."""
    return bool(body) and isinstance(body[-1], ast.Continue | ast.Return | ast.Break | ast.Raise)


def has_mod(node: ast.AST) -> bool:
    """A numeric ``%`` somewhere in ``node`` (string formatting excluded)."""
    for sub in walk_all(node):
        if (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Mod)
            and not (isinstance(sub.left, ast.Constant) and isinstance(sub.left.value, str | bytes))
            and not isinstance(sub.left, ast.JoinedStr)
        ):
            return True
    return False


def mult_factors(expr: ast.AST | None) -> list[ast.AST]:
    """The factors of a product ``a * b * c`` (``[expr]`` for anything else, ``[]`` for None)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return mult_factors(expr.left) + mult_factors(expr.right)
    return [] if expr is None else [expr]


def sum_terms(expr: ast.AST) -> list[ast.AST]:
    """The terms of a sum ``a + b + c`` (``[expr]`` for anything else)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return sum_terms(expr.left) + sum_terms(expr.right)
    return [expr]


def position(node: ast.AST) -> tuple[int, int]:
    """(line, col) of a node, for ordering."""
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def names_in(node: ast.AST) -> set[str]:
    """Dotted names (``loss``, ``self.loss``) read or written anywhere in ``node``."""
    out: set[str] = set()
    for sub in walk_all(node):
        if isinstance(sub, ast.Name | ast.Attribute):
            d = dotted(sub)
            if d:
                out.add(d)
    return out
