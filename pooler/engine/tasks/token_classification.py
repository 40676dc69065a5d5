"""Token classification: label scores per token (`token_classify`) and named entities
(`ner`) from a token-classification model, as the transformers pipeline reports them; a
GLiNER model's `ner` runs in zero_shot_ner.py."""
from __future__ import annotations

from typing import Sequence

from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.engine.lora import with_lora
from pooler.engine.tasks.common import TaskEngine, run_texts
from pooler.engine.tasks.zero_shot_ner import gliner_ner
from pooler.gliner import gliner_options_error, misplaced_options
from pooler.ner import SubwordRules, check_strategy, extract_entities
from pooler.outputs import Entity, TokenClassificationOutput, as_numpy
from pooler.params import PoolingParams
from pooler.pooling.activation import labels_of


@with_lora
def token_classify(engine: TaskEngine, inputs: str | Sequence, *,
                   use_activation: bool | None = None, skip_special_tokens: bool = False,
                   truncate: bool = True, truncate_prompt_tokens: int | None = None,
                   truncation_direction: str = "right", use_tqdm: bool | None = None,
                   priority: int = 0) -> list[TokenClassificationOutput]:
    """Label scores for every token ([num_tokens, num_labels] per input)."""
    items = normalize_inputs(inputs)
    params = PoolingParams(task="token_classify", use_activation=use_activation,
                           skip_special_tokens=skip_special_tokens)
    processed, results = run_texts(
        engine, items, engine.verify_params(params), TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction),
        use_tqdm, priority)
    labels = labels_of(engine.model_config.hf_config)
    outputs = []
    for item, r in zip(processed, results):
        probs = as_numpy(r.data)  # [num_kept_tokens, num_labels]
        ids = item.prompt_token_ids
        if skip_special_tokens and item.special_tokens_mask is not None:
            ids = [t for t, s in zip(ids, item.special_tokens_mask) if not s]
        outputs.append(TokenClassificationOutput(
            probs, list(ids), [labels[i] for i in probs.argmax(-1)], r.num_tokens,
            r.request_id))
    return outputs


@with_lora
def ner(engine: TaskEngine, inputs: str | list[str], *, labels: Sequence | None = None,
        threshold: float | None = None, flat_ner: bool | None = None,
        multi_label: bool | None = None, aggregation_strategy: str = "simple",
        ignore_labels: Sequence[str] = ("O",), ignore_subwords: bool = False,
        truncate: bool = True, truncate_prompt_tokens: int | None = None,
        truncation_direction: str = "right", use_tqdm: bool | None = None,
        priority: int = 0) -> list[list[Entity]]:
    """Entities of each text with character offsets.

    A token-classification model: as the transformers token-classification pipeline
    reports them (see pooler/ner.py), with `aggregation_strategy` / `ignore_labels` /
    `ignore_subwords`.
    A GLiNER model (zero-shot): `labels` (required) names the entity types to find, one
    list for every text or one list per text; spans scoring above `threshold` (default 0.5)
    are kept, best first, without overlaps (flat_ner=True, the default) or allowing an
    entity inside another (flat_ner=False); multi_label=True lets one span carry several
    labels. As gliner's predict_entities (see pooler/gliner.py); entity_group is the label."""
    items = normalize_inputs(inputs)
    if not all(isinstance(x, str) for x in items):
        raise ValueError("ner needs texts (entity offsets point into the text), not token "
                         "ids; pass strings.")
    if engine.model_config.gliner is not None:
        return gliner_ner(engine, items, labels, threshold, flat_ner, multi_label,
                          aggregation_strategy, ignore_labels, ignore_subwords, truncate,
                          truncate_prompt_tokens, truncation_direction, use_tqdm, priority)
    given = misplaced_options((("labels", labels, None), ("threshold", threshold, None),
                               ("flat_ner", flat_ner, None),
                               ("multi_label", multi_label, None)))
    if given:
        raise ValueError(gliner_options_error(given, "load",
                                              engine.model_config.architecture))
    check_strategy(aggregation_strategy, ignore_subwords)
    params = PoolingParams(task="token_classify", use_activation=True)
    processed, results = run_texts(
        engine, items, engine.verify_params(params), TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction),
        use_tqdm, priority)
    label_names = labels_of(engine.model_config.hf_config)
    rules = engine._subword_rules  # once per engine: may parse the vocabulary
    return [extract_entities(text, item.prompt_token_ids, as_numpy(r.data), item.offsets,
                             item.special_tokens_mask, label_names, rules,
                             aggregation_strategy, ignore_labels, ignore_subwords)
            for text, item, r in zip(items, processed, results)]


def subword_rules(engine: TaskEngine) -> SubwordRules:
    """How the tokenizer marks word pieces (Engine caches it: `_subword_rules`)."""
    return SubwordRules(engine.tokenizer.backend)
