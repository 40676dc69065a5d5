"""Large fp32 steps in the C layer stack or in torch's layers, chosen at load by timing both.

Steps of at most bert_cpu.MAX_TOKENS tokens always take the C layer stack (encoder_cpu.c's
bert_layers). A larger step can take it too, or run the model's torch layers (oneDNN GEMMs with
fused epilogues, the C attention kernel, torch's layer norm). Which one is faster depends on the
CPU: measured on Zen 4 over the long-text mix (`python benchmarks/layer_stack_ab.py`), the C
stack ran 1.12x faster with the AVX-512 build and 1.25x faster with the AVX2 build and the
torch libraries held to AVX2 (docs/dev/journal.md). On the AVX2 build oneDNN's fused erf GELU
epilogue was the weak part (61-65 GFLOP/s at 1 thread where its plain GEMM ran 80). No AVX2-only
CPU was at hand, so the choice is timed on the machine itself rather than read from its flags:
one step of CHECK_TOKENS tokens through each, alternating (precision_gate.interleaved_medians),
once per model shape and thread count in a process, each side's fastest round compared (both
run the same step, and a neighbour's job only adds time: with medians of 3 rounds a busy moment
once sent a load to the torch layers, C 82.9 against 77.9 ms, where C is ~1.1x faster over
whole jobs). The C stack is kept unless it is slower
than the torch layers by more than MARGIN, the precision gate's rule: at the check's step size
the two measured close on the AVX-512 build (C 1.02-1.09x faster per step, 2 threads), where
over a whole corpus C won by 1.12x (fewer allocations and eager ops between the GEMMs), so
a rule that asked C to win clearly would flip on noise there; on the AVX2 build C won each
step by 1.10-1.16x.

The step is timed through the first CHECK_LAYERS layers only: every layer has the same shape,
so the ratio per layer is the model's, and the check packs both weight layouts (encoder_cpu.c's
panels, oneDNN's blocked copy) for those layers alone. Timed through all of them, a 24-layer
XLM-R-large (BGE-M3) held three copies of its 1.2 GB of layer weights at once (the originals
and both packed copies: 4.1 GB RSS after load where sentence-transformers holds 1.9 GB), and
the dropped one stayed in the heap until a trim. After the check the loser's copies and the
C stack's partial pack are dropped and the heap is trimmed; the winner packs the whole stack
at its first step.

`POOLER_C_LAYER_STACK`: "auto" (default, the check), "all" (every step in C, no timing) or
"short" (only short steps in C: pooler before this check).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn

from pooler.kernels.bert_cpu import (LARGE_STEPS, MAX_TOKENS, drop_packed_stack,
                                     large_steps_eligible)
from pooler.kernels.build import encoder_kernels
from pooler.layers.linear import drop_packed_weights
from pooler.models.bert import BertLayer
from pooler.precision_gate import interleaved_medians
from pooler.worker.memory import trim_heap
from pooler.worker.precision_check import step_inputs

logger = logging.getLogger(__name__)

POLICY_ENV = "POOLER_C_LAYER_STACK"
POLICIES = ("auto", "all", "short")
CHECK_TOKENS = 512  # 4 sequences of 128: past MAX_TOKENS, small enough to cost ~0.2 s at load
TIMING_ROUNDS = 3
CHECK_LAYERS = 4  # layers the step runs through: same shape each, so the per-layer ratio holds
MARGIN = 0.05  # the C stack goes only when this much slower: level timings keep it

Measure = Callable[[Callable[[], object], Callable[[], object]], tuple[float, float]]


@dataclass(frozen=True)
class LayerStackDecision:
    large_steps_in_c: bool
    reason: str                                # one line for the log
    timings: tuple[float, float] | None = None  # (C stack, torch layers) seconds; None: untimed


def policy() -> str:
    value = os.environ.get(POLICY_ENV, "auto").strip().lower()
    if value not in POLICIES:
        raise ValueError(f"{POLICY_ENV} must be one of {', '.join(POLICIES)}, got {value!r}.")
    return value


# (model shape, threads, kernel build) -> decision: engines of one model in a process (tests,
# replicas) time it once.
_DECISIONS: dict[tuple, LayerStackDecision] = {}


def choose_large_step_path(backbone: nn.Module, max_model_len: int,
                           measure: Measure | None = None) -> LayerStackDecision:
    """Decide, and set on `backbone`, whether its steps above MAX_TOKENS take the C layer
    stack. measure(c_stack, torch_layers) -> (seconds, seconds) replaces the timer (and the
    per-process memo) in tests."""
    layers = backbone._modules.get("layers") or ()
    # BertLayer: what run_layers (BERT, DistilBERT, MPNet and their kin) hands to the C stack
    if not (layers and all(type(layer) is BertLayer for layer in layers)
            and large_steps_eligible(backbone)):
        # not logged at info: an int8 or bf16 engine would read that its fp32 steps use oneDNN
        logger.debug("large steps: not an fp32 BERT-family stack with the CPU kernels built")
        return LayerStackDecision(False, "not eligible (not an fp32 BERT-family stack with the "
                                         "CPU kernels built)")
    chosen = policy()
    if chosen != "auto":
        decision = LayerStackDecision(chosen == "all", f"{POLICY_ENV}={chosen}")
    else:
        cfg = backbone.config
        key = (type(backbone).__name__, cfg.hidden_size, cfg.intermediate_size,
               cfg.num_attention_heads, len(backbone.layers), cfg.hidden_act, max_model_len,
               torch.get_num_threads(), encoder_kernels().variant)
        decision = None if measure is not None else _DECISIONS.get(key)
        if decision is None:
            decision = _timed(backbone, max_model_len,
                              measure or partial(interleaved_medians, rounds=TIMING_ROUNDS,
                                                 statistic=min))
            if measure is None:
                _DECISIONS[key] = decision
    backbone.__dict__[LARGE_STEPS] = decision.large_steps_in_c
    if decision.timings is not None:
        release_check_copies(backbone, decision.large_steps_in_c)
    logger.info("fp32 steps above %d tokens: %s (%s)", MAX_TOKENS,
                "C layer stack" if decision.large_steps_in_c else "torch layers (oneDNN)",
                decision.reason)
    return decision


def release_check_copies(backbone: nn.Module, large_steps_in_c: bool) -> None:
    """Free what the timing packed that the chosen path will not read, and give it back to the
    system: the C stack's pack of the timed layers (keyed on those layers alone, so the first
    step would repack the whole stack anyway), and, when every step takes the C stack, oneDNN's
    packed weights. Where the torch layers won, oneDNN's copies of the timed layers stay: large
    steps read them."""
    drop_packed_stack(backbone)
    if large_steps_in_c:
        drop_packed_weights(backbone)  # the timing's torch side packed them for oneDNN
    trim_heap()


def _timed(backbone: nn.Module, max_model_len: int, measure: Measure) -> LayerStackDecision:
    seq_len = min(128, max_model_len)
    num_seqs = max(1, CHECK_TOKENS // seq_len)
    inputs = step_inputs(num_seqs, seq_len, backbone.get_input_embeddings().num_embeddings)
    layers = backbone._modules["layers"]
    timed_layers = nn.ModuleList(list(layers)[:CHECK_LAYERS])  # the same modules, shared

    def step(in_c: bool) -> None:
        backbone.__dict__[LARGE_STEPS] = in_c
        with torch.inference_mode():
            backbone(inputs)

    backbone._modules["layers"] = timed_layers
    try:
        c_seconds, torch_seconds = measure(partial(step, True), partial(step, False))
    finally:
        backbone._modules["layers"] = layers
    in_c = c_seconds <= torch_seconds * (1 + MARGIN)
    variant = encoder_kernels().variant
    return LayerStackDecision(
        in_c, f"timed on {num_seqs}x{seq_len} tokens through {len(timed_layers)} of "
              f"{len(layers)} layers, {variant} build: C stack "
              f"{c_seconds * 1e3:.1f} ms, torch layers {torch_seconds * 1e3:.1f} ms",
        (c_seconds, torch_seconds))
