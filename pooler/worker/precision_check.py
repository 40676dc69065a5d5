"""Rule 2 of issue 30 at model load: a requested int8 backbone is timed against its fp32 twin on
the step shapes this engine will run, and kept only where it is not slower (the rule and the
log line live in pooler/precision_gate.py; `ModelConfig.precision_check` picks the policy).

The shapes: one short query (1 sequence of SHORT_QUERY_TOKENS tokens, what a search box sends),
a mid short step (MID_SHORT_SEQUENCES such queries packed: 48 tokens, what a burst of queries
makes) and one full step of the scheduler's token budget (sequences of min(128,
max_model_len) tokens filling it: what a corpus job runs). Each side is timed as the median of
TIMING_ROUNDS forwards, the two sides alternating, after one warm-up each (which also packs
weights), so the check costs about 10 forwards of a full step: ~2 s for all-MiniLM-L6-v2 on 2
cores at the default 2048-token budget.

Per step size, where the model can run them apart (the BERT families, whose short steps run a
C layer stack: int8_bert_layers for int8, bert_layers for fp32): short steps (the two short
shapes) take int8's C stack only where it is not slower than fp32's, large steps (the full
step) int8's layers only where they are not slower than fp32's. The engine keeps what that
needs: the int8 model if int8 won any size, with fp32 copies of its linears for the fp32 short
stack only where fp32 won short steps; where int8 won short steps only, the fp32 model with its
int8 twin's layers kept for short steps (bert_int8_cpu.SHORT_STEP_LAYERS); the fp32 model alone
where fp32 won everything. Other families: one choice for every step.
"""
from __future__ import annotations

import copy
import logging
from functools import partial

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.kernels.bert_cpu import stack_config_ok
from pooler.kernels.bert_int8_cpu import SHORT_STEP_LAYERS
from pooler.kernels.build import encoder_kernels
from pooler.kernels.int8_cpu import int8_path
from pooler.layers.quantization import Int8Linear, keep_fp32_short_steps
from pooler.models.inputs import ModelInputs
from pooler.precision_gate import (Outcome, PrecisionDecision, ShapeCase, decide,
                                   interleaved_medians)

logger = logging.getLogger(__name__)

SHORT_QUERY_TOKENS = 12
MID_SHORT_SEQUENCES = 4  # 4 x 12 = 48 tokens: within both C stacks' limits
SHORT_STEPS, LARGE_STEPS = "short steps", "large steps"  # the gate's size ranges
STEP_SEQUENCE_TOKENS = 128
TIMING_ROUNDS = 4  # alternating calls per side and shape (precision_gate.interleaved_medians)


def step_inputs(num_seqs: int, seq_len: int, vocab_size: int) -> ModelInputs:
    """A packed batch of `num_seqs` sequences of `seq_len` tokens (ids drawn with a fixed seed,
    away from the special ids at the start of most vocabularies)."""
    g = torch.Generator().manual_seed(0)
    low = min(1000, vocab_size // 2)
    ids = torch.randint(low, vocab_size, (num_seqs * seq_len,), generator=g)
    return ModelInputs(
        input_ids=ids, positions=torch.arange(seq_len).repeat(num_seqs), token_type_ids=None,
        cu_seqlens=torch.arange(0, num_seqs * seq_len + 1, seq_len, dtype=torch.int32),
        seq_lens=[seq_len] * num_seqs, max_seqlen=seq_len)


def step_shapes(model_config: ModelConfig, token_budget: int
                ) -> list[tuple[str, ModelInputs, str]]:
    """(name, inputs, size range) of each shape the check times (see the module docstring)."""
    vocab = int(model_config.hf_config.get("vocab_size") or 30522)
    seq_len = min(STEP_SEQUENCE_TOKENS, model_config.max_model_len)
    short = min(SHORT_QUERY_TOKENS, model_config.max_model_len)
    num_seqs = max(1, token_budget // seq_len)
    return [(f"1x{short} tokens", step_inputs(1, short, vocab), SHORT_STEPS),
            (f"{MID_SHORT_SEQUENCES}x{short} tokens",
             step_inputs(MID_SHORT_SEQUENCES, short, vocab), SHORT_STEPS),
            (f"{num_seqs}x{seq_len} tokens", step_inputs(num_seqs, seq_len, vocab), LARGE_STEPS)]


def short_steps_apart(backbone: nn.Module) -> bool:
    """Whether `backbone` runs short steps on a C layer stack (fp32 or int8), so that they can
    take another precision than large steps."""
    return bool(getattr(backbone, "short_steps_in_c", False)) and stack_config_ok(backbone)


def short_steps_stay_fp32(int8_backbone: nn.Module) -> bool:
    """True when the int8 backbone runs steps of up to MAX_TOKENS tokens on the fp32 C layer
    stack (every int8 layer kept its fp32 copy for it, and the kernels are built here)."""
    layers = [m for m in int8_backbone.modules() if isinstance(m, Int8Linear)]
    return bool(layers) and encoder_kernels() is not None and all(
        m.fp32_weight is not None for m in layers)


def _forward(backbone: nn.Module, inputs: ModelInputs) -> None:
    with torch.inference_mode():
        backbone(inputs)


def choose_int8_or_fp32(fp32_model: nn.Module, model_config: ModelConfig, token_budget: int,
                        quantize, measure=None) -> tuple[nn.Module, PrecisionDecision]:
    """The model to serve for a config that asks for int8, and the decision behind it.

    fp32_model: the loaded fp32 model. quantize(model) quantizes a model in place (the
    loader's apply_quantization). With precision_check "off" the fp32 model is quantized in
    place and no timing runs; otherwise an int8 copy is timed against it and the loser is
    dropped. measure: the gate's timer (replaced by fake timings in tests)."""
    policy = model_config.precision_check
    path = int8_path()
    if policy == "off":
        quantize(fp32_model)
        fp32_model.precision_path = f"int8 ({path})"
        decision = decide("int8", [], on_slower="off")
        logger.info("int8 path %s: %s", path, decision.reason)
        return fp32_model, decision
    int8_model = copy.deepcopy(fp32_model)
    quantize(int8_model)
    apart = short_steps_apart(int8_model.backbone)
    cases = [ShapeCase(name, candidate=partial(_forward, int8_model.backbone, inputs),
                       fp32=partial(_forward, fp32_model.backbone, inputs),
                       size_range=size_range if apart else "")
             for name, inputs, size_range in step_shapes(model_config, token_budget)]
    decision = decide("int8", cases, on_slower=policy, measure=measure,  # may raise (refuse)
                      measure_pair=partial(interleaved_medians, rounds=TIMING_ROUNDS))
    if decision.use_candidate and not decision.candidate_for(LARGE_STEPS):
        # int8 won short steps only: fp32 serves, with int8's layers for short steps
        keep_int8_short_steps(fp32_model, int8_model)
        fp32_model.precision_path = f"float32, int8 short steps ({path})"
        return fp32_model, decision
    if decision.use_candidate:
        if decision.outcome is Outcome.FASTER:  # the other outcomes logged a warning already
            logger.info("int8 path %s: %s", path, decision.reason)
        if apart and not decision.candidate_for(SHORT_STEPS):
            keep_fp32_short_steps(int8_model, fp32_model)  # short steps: the fp32 C stack
        int8_model.precision_path = f"int8 ({path})"
        return int8_model, decision
    fp32_model.precision_path = "float32 (int8 fallback)"
    return fp32_model, decision


def keep_int8_short_steps(fp32_model: nn.Module, int8_model: nn.Module) -> None:
    """fp32_model's short steps run int8_model's layers on the int8 C stack (the rest of
    int8_model is dropped)."""
    fp32_model.backbone.__dict__[SHORT_STEP_LAYERS] = list(int8_model.backbone.layers)


def refresh_int8_short_steps(model: nn.Module, int8_model) -> None:
    """After new weights were loaded into `model`: its int8 short-step layers, if it keeps any
    (keep_int8_short_steps), take the state of int8_model() (the new weights, quantized)."""
    backbone = getattr(model, "backbone", None)
    layers = backbone.__dict__.get(SHORT_STEP_LAYERS) if backbone is not None else None
    if not layers:
        return
    fresh = int8_model()
    with torch.no_grad():
        for mine, theirs in zip(layers, fresh.backbone.layers):
            mine.load_state_dict(theirs.state_dict())
