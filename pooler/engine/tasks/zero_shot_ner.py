"""Zero-shot NER with a GLiNER span model: each (text, labels) is one sequence in the
engine's batches (inputs: pooler/engine/gliner_inputs.py); the span head scores it, decoding
runs here (pooler/gliner.py)."""
from __future__ import annotations

from pooler.engine.tasks.common import TaskEngine, tokenizing
from pooler.gliner import PARAMS_KEY as GLINER_PARAMS_KEY
from pooler.gliner import (check_threshold, decode_spans, labels_required_error,
                           misplaced_options, normalize_labels, spans_to_entities,
                           split_words, token_options_error)
from pooler.outputs import Entity, as_numpy
from pooler.params import PoolingParams


def gliner_ner(engine: TaskEngine, items: list[str], labels, threshold, flat_ner, multi_label,
               aggregation_strategy, ignore_labels, ignore_subwords, truncate,
               truncate_prompt_tokens, truncation_direction, use_tqdm,
               priority) -> list[list[Entity]]:
    """`ner` on a GLiNER model: the token-classification options are refused, `labels`
    is required."""
    if labels is None:
        raise ValueError(labels_required_error("labels=['person', 'company']"))
    refused = misplaced_options((
        ("aggregation_strategy", aggregation_strategy, "simple"),
        ("ignore_labels", tuple(ignore_labels or ()), ("O",)),
        ("ignore_subwords", ignore_subwords, False),
        ("truncate_prompt_tokens", truncate_prompt_tokens, None),
        ("truncation_direction", truncation_direction, "right")))
    if refused:
        raise ValueError(token_options_error(refused))
    label_sets = normalize_labels(labels, len(items))
    threshold = check_threshold(0.5 if threshold is None else threshold)
    flat_ner = True if flat_ner is None else bool(flat_ner)
    multi_label = bool(multi_label)
    todo, built, results = engine.gliner_span_scores(items, label_sets, truncate, use_tqdm,
                                                     priority)
    out: list[list[Entity]] = [[] for _ in items]
    for i, item, r in zip(todo, built, results):
        spans = decode_spans(as_numpy(r.data), len(item.words), item.labels, threshold,
                             flat_ner, multi_label)
        out[i] = spans_to_entities(items[i], item.words, spans)
    return out


def gliner_span_scores(engine: TaskEngine, items: list[str], label_sets: list[list[str]],
                       truncate: bool = True, use_tqdm: bool | None = None,
                       priority: int = 0):
    """Run (text, labels) pairs through a GLiNER model. Returns the indices of the texts
    that hold a word (the others have no span), their built inputs (words, labels) and
    their results, whose data is [num_words, max_width, num_labels] span probabilities."""
    with tokenizing():
        todo = [i for i, text in enumerate(items) if split_words(text)]
        built = engine.gliner_inputs.build([items[i] for i in todo],
                                           [label_sets[i] for i in todo], truncate, todo)
    base = engine.verify_params(PoolingParams(task="token_classify",
                                              extra={GLINER_PARAMS_KEY: {}}))
    params = []
    for item in built:
        p = base.clone()
        p.extra[GLINER_PARAMS_KEY] = item.head_inputs
        params.append(p)
    results = engine.run_processed([b.processed for b in built], params, priority, use_tqdm)
    return todo, built, results


def gliner_input_builder(engine: TaskEngine):
    """(text, labels) -> ProcessedInput for this engine's GLiNER model (Engine caches it:
    `gliner_inputs`)."""
    from pooler.engine.gliner_inputs import GLiNERInputBuilder

    if engine.model_config.gliner is None:
        raise ValueError(f"{engine.model_config.model} is not a GLiNER model (no "
                         "gliner_config.json).")
    return GLiNERInputBuilder(engine.model_config.gliner, engine.tokenizer,
                              engine.model_config.max_model_len)
