"""`dtype="bfloat16"` on the CPU: the backbone's linear layers compute in bf16 through oneDNN
(AVX512_BF16 or AMX-BF16), everything else stays fp32, and the choice is checked at load.

Why not `model.to(bfloat16)` as on a GPU: an all-bf16 MiniLM measured min cosine 0.99988 to fp32
on the bench corpus (the residual stream and the layer norms lose digits) and barely any speed,
since torch's bf16 norms, softmax and casts are no faster than fp32 ones. Only the GEMMs gain
from bf16 silicon, so only their inputs are rounded (pooler/layers/linear.py, Bf16Linear).

Steps of at most 48 tokens (one short query) keep the fp32 C kernel
(pooler/kernels/bert_cpu.py) where the model has one: it measured faster than the bf16 oneDNN
layers there (a 12-token query is latency-bound, not GEMM-bound), so the check times larger
steps only.

Rule 2 of issue 30 (pooler/precision_gate.py): on a CPU without bf16 dot products oneDNN would
emulate them, slower than fp32, so the path is refused up front; on one with them, a few
forward passes at load time bf16 against fp32 on step shapes the engine runs, and
`precision_check` ("fallback", "refuse", "off") says what happens when bf16 is not faster.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.cpu_features import CpuFeatures, cpu_features
from pooler.layers.linear import BF16_ONEDNN, Bf16Swap
from pooler.models.inputs import ModelInputs
from pooler.precision_gate import PrecisionDecision, ShapeCase, decide

log = logging.getLogger(__name__)

# (sequences, tokens each) of the timed steps: one sequence just past the C kernel's reach,
# and a batch of passages (a quarter of the default CPU token budget, to keep load short).
CHECK_SHAPES = ((1, 64), (4, 128))


def bf16_path_name(cpu: CpuFeatures) -> str:
    """What runs the bf16 GEMMs on this CPU, for logs and the bench."""
    if not BF16_ONEDNN:
        return "torch-bf16 (no oneDNN bf16)"
    if cpu.has("amx_bf16"):
        return "onednn-bf16 (amx)"
    if cpu.has("avx512_bf16"):
        return "onednn-bf16 (avx512_bf16)"
    return "onednn-bf16 (emulated)"


def _step_inputs(backbone: nn.Module, count: int, length: int, device: torch.device
                 ) -> ModelInputs:
    """A packed step of `count` sequences of `length` tokens, ids seeded and in the vocab."""
    vocab = backbone.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (count * length,), generator=generator)
    return ModelInputs(input_ids=ids.to(device),
                       positions=torch.arange(length).repeat(count).to(device),
                       token_type_ids=None,
                       cu_seqlens=torch.arange(0, count * length + 1, length,
                                               dtype=torch.int32, device=device),
                       seq_lens=[length] * count, max_seqlen=length)


def _shape_cases(backbone: nn.Module, swap: Bf16Swap, model_config: ModelConfig
                 ) -> list[ShapeCase]:
    longest = model_config.max_model_len or 512
    cases = []
    for count, length in CHECK_SHAPES:
        length = min(length, longest)
        inputs = _step_inputs(backbone, count, length, model_config.torch_device)

        def run(to_bf16: bool, inputs=inputs):
            swap.use(to_bf16)
            with torch.inference_mode():
                return backbone(inputs)
        cases.append(ShapeCase(f"{count}x{length} tokens", lambda run=run: run(True),
                               lambda run=run: run(False)))
    return cases


def choose_cpu_bf16(backbone: nn.Module, model_config: ModelConfig,
                    cpu: CpuFeatures | None = None, measure=None) -> PrecisionDecision:
    """Swap the backbone's linears to bf16 when the check keeps bf16, else leave them fp32
    (a logged fallback, or a ValueError under precision_check="refuse")."""
    cpu = cpu or cpu_features()
    supported = cpu.bf16 and BF16_ONEDNN
    why = ("it has neither AVX512_BF16 nor AMX-BF16, so oneDNN would emulate bf16 products, "
           "slower than fp32" if not cpu.bf16 else
           "this torch build has no oneDNN bf16 inner product")
    swap = Bf16Swap(backbone)
    cases = _shape_cases(backbone, swap, model_config) \
        if supported and model_config.precision_check != "off" else []
    try:
        decision = decide("bfloat16", cases, on_slower=model_config.precision_check, cpu=cpu,
                          supported=supported, unsupported_why=why,
                          measure=measure)
    finally:
        swap.use(False)  # the timing may leave either kind in place
    swap.use(decision.use_candidate)
    # Decoder attention gets fp32 q/k/v from the bf16 linears (encoders keep theirs bf16 for the
    # bf16 kernel): let it round to bf16 where bf16 pays, as an int8 engine does. Only long
    # causal/global sequences change path (SDPA in bf16 on AMX); the check's short shapes
    # never reach them, so it is set after the decision.
    for module in backbone.modules():
        if getattr(module, "bf16_engine_products", False):
            module.attention_bf16_products = decision.use_candidate
    if decision.use_candidate:
        log.info("%s", decision.reason)
    return decision
