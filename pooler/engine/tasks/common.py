"""What every task module needs of the engine (the `TaskEngine` protocol) and the one path
from user inputs to results: normalize, tokenize (timed for the caller's CallContext), run."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Protocol, Sequence

from pooler.engine import image_inputs
from pooler.engine.engine_loop import current_call
from pooler.engine.input_processor import (ProcessedInput, TruncationOptions,
                                           normalize_inputs)
from pooler.engine.request import RequestOutput
from pooler.params import PoolingParams


class TaskEngine(Protocol):
    """The engine as task modules see it (pooler.engine.llm.Engine provides it): the tasks
    depend on this interface, the engine on the tasks, never both ways."""
    model_config: Any
    tokenizer: Any
    processor: Any
    images: Any  # image-text models' image side (pooler/engine/image_inputs.py), else None
    pages: Any  # page retrieval models' input side (pooler/engine/page_inputs.py), else None
    # Built once per engine, on first use, by the task modules' builders:
    colbert_inputs: Any  # late_interaction.colbert_input_builder
    gliner_inputs: Any  # zero_shot_ner.gliner_input_builder
    _subword_rules: Any  # token_classification.subword_rules
    _static_query_encoder: Any  # sparse.static_query_encoder

    @property
    def supported_tasks(self) -> frozenset[str]: ...
    def verify_params(self, params: PoolingParams) -> PoolingParams: ...
    def run_processed(self, processed: list, params: list[PoolingParams], priority: int = 0,
                      use_tqdm: bool | None = None, **kwargs) -> list: ...
    def check_lora(self, name: str) -> None: ...
    def drop_cached_queries(self, keys: list[str]) -> None: ...
    def classify(self, inputs: Any, **kwargs) -> list: ...
    def gliner_span_scores(self, items: list[str], label_sets: list[list[str]],
                           truncate: bool = True, use_tqdm: bool | None = None,
                           priority: int = 0) -> tuple: ...


@contextmanager
def tokenizing():
    """Adds the time spent inside the block, when it succeeds, to the caller's CallContext
    (the server's tokenization metric)."""
    started = time.perf_counter()
    yield
    call = current_call.get()
    if call is not None:
        call.tokenize_seconds += time.perf_counter() - started


def encode_inputs(engine: TaskEngine, inputs: Any, params: PoolingParams,
                  truncation: TruncationOptions, prompt: str | None, prompt_name: str | None,
                  use_tqdm: bool | None, priority: int, pairs: list[str] | None = None,
                  add_special_tokens: bool = True) -> list[RequestOutput]:
    """User inputs (texts or token ids, see normalize_inputs) with one params for all:
    verified, prompted, tokenized and run; the results in input order."""
    if pairs is None and image_inputs.handles(engine, inputs):  # Engine.encode, vLLM /pooling
        return image_inputs.encode(engine, inputs, params, truncation, use_tqdm, priority,
                                   unsupported={"prompt": prompt, "prompt_name": prompt_name})
    params = engine.verify_params(params)
    items = normalize_inputs(inputs)
    prompt_text = engine.processor.resolve_prompt(prompt, prompt_name)
    return run_texts(engine, items, params, truncation, use_tqdm, priority, pairs,
                     prompt_text, add_special_tokens)[1]


def run_texts(engine: TaskEngine, items: Sequence, params: PoolingParams,
              truncation: TruncationOptions, use_tqdm: bool | None, priority: int,
              pairs: list[str] | None = None, prompt: str | None = None,
              add_special_tokens: bool = True, max_pair_tokens: int | None = None
              ) -> tuple[list[ProcessedInput], list[RequestOutput]]:
    """Tokenize normalized items (the time goes to the caller's CallContext, for the
    server's metrics) and run them with verified params; returns the processed inputs
    (offsets, special-token masks) with the results."""
    with tokenizing():
        processed = engine.processor.process(items, pairs=pairs, truncation=truncation,
                                             prompt=prompt,
                                             add_special_tokens=add_special_tokens,
                                             max_pair_tokens=max_pair_tokens)
    return processed, engine.run_processed(processed, [params] * len(processed), priority,
                                           use_tqdm)
