"""BGE-M3 folders as they exist on disk: an XLM-R checkpoint with `colbert_linear.pt` and
`sparse_linear.pt` (torch state dicts of two nn.Linear) beside it.

From one forward pass BGE-M3 gives three outputs (FlagEmbedding's BGEM3FlagModel):
- dense: the [CLS] state, L2-normalized;
- sparse: relu(sparse_linear(h)) per token, the max per token id, the tokenizer's cls / eos /
  pad / unk ids left out (lexical weights);
- ColBERT: colbert_linear(h) on every token after [CLS], L2-normalized (multi-vector).
The heads live in pooler/pooling/bge_m3.py; this module only says whether a folder is one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pooler.model_folder import read_json

BGE_M3_OUTPUTS = ("dense", "sparse", "colbert")
# FlagEmbedding's compute_score weights for (dense, sparse, colbert) when none are given.
DEFAULT_WEIGHTS = (1.0, 1.0, 1.0)
SCORE_MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")
_ENCODER_TYPES = ("xlm-roberta", "roberta", "bert")


@dataclass(frozen=True)
class BGEM3Layout:
    colbert_path: Path
    sparse_path: Path
    unused_token_ids: tuple[int, ...]  # cls, eos, pad, unk: never in the lexical weights


def detect_bge_m3(path: Path, hf_config: dict) -> BGEM3Layout | None:
    colbert, sparse = path / "colbert_linear.pt", path / "sparse_linear.pt"
    if not (colbert.is_file() and sparse.is_file()):
        return None
    if hf_config.get("model_type") not in _ENCODER_TYPES:
        raise ValueError(f"{path} has BGE-M3 heads (colbert_linear.pt, sparse_linear.pt) but a "
                         f"{hf_config.get('model_type')!r} backbone; pooler runs them on "
                         f"{', '.join(_ENCODER_TYPES)} encoders.")
    return BGEM3Layout(colbert, sparse, _special_token_ids(path))


def _special_token_ids(path: Path) -> tuple[int, ...]:
    """The ids of the tokenizer's cls / eos / pad / unk tokens (FlagEmbedding drops them)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    declared = {**(read_json(path / "special_tokens_map.json") or {}),
                **(read_json(path / "tokenizer_config.json") or {})}
    ids = set()
    for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
        token = declared.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            ids.add(tokenizer.token_to_id(token))
    return tuple(sorted(ids))


def check_outputs(outputs) -> tuple[str, ...]:
    """Validate a request's BGE-M3 output selection: a non-empty subset of BGE_M3_OUTPUTS."""
    if isinstance(outputs, str):
        outputs = [outputs]
    if not isinstance(outputs, (list, tuple)) or not outputs or \
            any(o not in BGE_M3_OUTPUTS for o in outputs):
        raise ValueError(f"bge_m3 outputs must be a non-empty list of {list(BGE_M3_OUTPUTS)}, "
                         f"got {outputs!r}.")
    return tuple(o for o in BGE_M3_OUTPUTS if o in outputs)


def check_weights(weights) -> tuple[float, float, float]:
    if weights is None:
        return DEFAULT_WEIGHTS
    if not isinstance(weights, (list, tuple)) or len(weights) != 3 or \
            not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
        raise ValueError("bge_m3 weights must be three numbers (dense, sparse, colbert), e.g. "
                         f"[0.4, 0.2, 0.4]; got {weights!r}.")
    if sum(weights[:2]) == 0 or sum(weights) == 0:
        raise ValueError(f"bge_m3 weights must not sum to zero, got {weights!r}.")
    return tuple(float(w) for w in weights)  # type: ignore[return-value]
