"""Sequence classification (`classify`, single texts or sentence pairs) and the
cross-encoder's relevance scores for score / rerank."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.engine.lora import with_lora
from pooler.engine.tasks.common import TaskEngine, run_texts
from pooler.engine.tasks.pairs import ScoreRequest
from pooler.outputs import ClassificationOutput, as_numpy
from pooler.params import PoolingParams
from pooler.pooling.activation import labels_of


@with_lora
def classify(engine: TaskEngine, inputs: str | Sequence, *,
             text_pair: str | list[str] | None = None, use_activation: bool | None = None,
             truncate: bool = True, truncate_prompt_tokens: int | None = None,
             add_special_tokens: bool = True, max_pair_tokens: int | None = None,
             truncation_direction: str = "right", use_tqdm: bool | None = None,
             priority: int = 0) -> list[ClassificationOutput]:
    """Score each input (or each (input, text_pair) pair) against the model's labels.

    Activation as the model declares it (see pooler/pooling/activation.py);
    use_activation=False returns raw logits. max_pair_tokens cuts each text_pair to that
    many tokens before the pair is joined (a reranker's max_tokens_per_doc)."""
    items = normalize_inputs(inputs)
    pairs = check_pairs(engine, items, text_pair)
    if max_pair_tokens is not None and pairs is None:
        raise ValueError("max_pair_tokens applies to sentence pairs; pass text_pair.")
    params = PoolingParams(task="classify", use_activation=use_activation)
    processed, results = run_texts(
        engine, items, engine.verify_params(params),
        TruncationOptions(truncate, truncate_prompt_tokens, truncation_direction),
        use_tqdm, priority, pairs=pairs, add_special_tokens=add_special_tokens,
        max_pair_tokens=max_pair_tokens)
    labels = labels_of(engine.model_config.hf_config)
    outputs = []
    for r in results:
        probs = as_numpy(r.data)  # [num_labels]
        order = np.argsort(-probs, kind="stable")
        ranked = [{"label": labels[i], "score": float(probs[i])} for i in order]
        outputs.append(ClassificationOutput(probs, ranked[0]["label"], ranked[0]["score"],
                                            ranked, r.num_tokens, r.request_id))
    return outputs


def check_pairs(engine: TaskEngine, items: list, text_pair) -> list[str] | None:
    """Validate text_pair against the inputs and the model.

    A model is pair-capable when it is an encoder whose tokenizer puts a separator between
    the two texts (BERT `[SEP]`, RoBERTa `</s></s>`) and whose token-type embeddings cover
    the type ids that template assigns (or who has none, ignoring them). Decoders take one
    text: format pairs in a prompt."""
    if text_pair is None:
        return None
    pairs = [text_pair] if isinstance(text_pair, str) else text_pair
    if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, str) for p in pairs):
        raise ValueError("text_pair must be a string or a list of strings.")
    if len(pairs) != len(items):
        raise ValueError(f"text_pair has {len(pairs)} texts but there are {len(items)} "
                         "inputs; give one text_pair per input.")
    if not all(isinstance(x, str) for x in items):
        raise ValueError("Sentence pairs must be given as texts, not token ids.")
    reason = None if engine.model_config.rerank_prompt else _pair_incapable_reason(engine)
    if reason:
        raise ValueError(f"text_pair was given, but this model does not take sentence "
                         f"pairs: {reason}. Pass single texts (join the two texts "
                         "yourself if the model was trained on such a format).")
    return list(pairs)


def _pair_incapable_reason(engine: TaskEngine) -> str | None:
    if engine.model_config.attn_type != "encoder_only":
        return "it is a decoder"
    if engine.tokenizer.num_special_tokens_to_add(pair=True) <= \
            engine.tokenizer.num_special_tokens_to_add(pair=False):
        return "its tokenizer puts no separator between two texts"
    if "type_vocab_size" not in engine.model_config.hf_config:
        return None  # no token type embeddings (MPNet, DistilBERT): type ids are unused
    type_ids = engine.tokenizer.encode_batch(["a"], ["b"])[0].token_type_ids
    type_vocab = int(engine.model_config.hf_config.get("type_vocab_size", 1))
    # type_vocab_size 0 (DeBERTa-v3): no token-type embeddings, the ids are ignored and
    # the separator alone marks the second text, as transformers runs it.
    if type_vocab > 0 and max(type_ids) >= type_vocab:
        return (f"its tokenizer marks the second text with token type {max(type_ids)} but "
                f"the model has type_vocab_size={type_vocab}")
    return None


def cross_encoder_scores(engine: TaskEngine, request: ScoreRequest,
                         truncation: TruncationOptions, use_tqdm, priority, use_activation,
                         max_tokens_per_doc: int | None = None
                         ) -> tuple[list[float], list[int]]:
    """Each (query, document) pair classified as one sequence (through engine.classify)."""
    if not all(isinstance(x, str) for x in request.queries + request.documents):
        raise ValueError("A cross-encoder scores text pairs: pass queries and documents as "
                         "strings, not token ids.")
    outputs = engine.classify([request.queries[qi] for qi, _ in request.pairs],
                              text_pair=[request.documents[di] for _, di in request.pairs],
                              truncate=truncation.truncate,
                              truncate_prompt_tokens=truncation.truncate_prompt_tokens,
                              truncation_direction=truncation.direction, use_tqdm=use_tqdm,
                              priority=priority, use_activation=use_activation,
                              max_pair_tokens=max_tokens_per_doc)
    # One relevance label (the usual reranker): its sigmoid; else the top class probability.
    return ([float(o.probs[0]) if np.asarray(o.probs).shape[0] == 1 else float(o.score)
             for o in outputs], [int(o.num_tokens) for o in outputs])
