"""`Engine`: the offline entry point. Validate and tokenize, submit, step until done, return
results in input order. Callers never batch or sort: the scheduler does."""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from pooler.config import EngineConfig, ModelConfig, SchedulerConfig
from pooler.engine.core import EngineCore
from pooler.engine.input_processor import (InputProcessor, ProcessedInput, TruncationOptions,
                                           normalize_inputs)
from pooler.engine.request import Request, RequestOutput
from pooler.engine.tokenizer import TextTokenizer
from pooler.model_folder import DEFAULT_MODEL
from pooler.outputs import EmbeddingOutput, PoolingOutput, TokenEmbeddingOutput
from pooler.params import PoolingParams

# Offline jobs at least this long show a progress bar unless use_tqdm says otherwise.
_TQDM_MIN_INPUTS = 100


class Engine:
    """Serve a pooling model offline.

    >>> engine = Engine("sentence-transformers/all-MiniLM-L6-v2")
    >>> engine.embed(["a sentence", "another"])[0].embedding.shape
    (384,)
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, task: str | None = None,
                 runner: str = "native", dtype: str = "float32", device: str = "auto",
                 max_model_len: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int = 256, num_threads: int | None = None,
                 hf_overrides: dict[str, Any] | None = None, quantization: str | None = None):
        self.model_config = ModelConfig(
            model=model, task=task, runner=runner, dtype=dtype, device=device,
            max_model_len=max_model_len, hf_overrides=hf_overrides, quantization=quantization)
        self.config = EngineConfig(
            self.model_config,
            SchedulerConfig.for_model(self.model_config, max_num_batched_tokens, max_num_seqs),
            num_threads=num_threads)
        lowercase = bool(self.model_config.st and self.model_config.st.do_lower_case)
        self.tokenizer = TextTokenizer(self.model_config.path, self.model_config.tokenizer_config,
                                       lowercase=lowercase)
        self.processor = InputProcessor(self.model_config, self.tokenizer)
        self.core = EngineCore(self.config)
        self._ids = itertools.count()

    # ---- facts --------------------------------------------------------------------------
    @property
    def supported_tasks(self) -> frozenset[str]:
        return self.core.model_runner.supported_tasks

    @property
    def default_task(self) -> str:
        return self.core.model_runner.pooling_runner.selected_task

    # ---- public tasks -------------------------------------------------------------------
    def embed(self, inputs: str | Sequence, *, dimensions: int | None = None,
              normalize: bool | None = None, truncate: bool = True,
              truncate_prompt_tokens: int | None = None, truncation_direction: str = "right",
              prompt: str | None = None, prompt_name: str | None = None,
              use_tqdm: bool | None = None, priority: int = 0) -> list[EmbeddingOutput]:
        params = PoolingParams(task="embed", dimensions=dimensions, normalize=normalize)
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
            use_tqdm, priority)
        return [EmbeddingOutput(_as_numpy(r.data), r.num_tokens, r.request_id)
                for r in results]

    def token_embed(self, inputs: str | Sequence, *, normalize: bool | None = None,
                    skip_special_tokens: bool = False, truncate: bool = True,
                    truncate_prompt_tokens: int | None = None,
                    truncation_direction: str = "right", prompt: str | None = None,
                    prompt_name: str | None = None, use_tqdm: bool | None = None,
                    priority: int = 0) -> list[TokenEmbeddingOutput]:
        params = PoolingParams(task="token_embed", normalize=normalize,
                               skip_special_tokens=skip_special_tokens)
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
            use_tqdm, priority)
        return [TokenEmbeddingOutput(_as_numpy(r.data), r.num_tokens, r.request_id)
                for r in results]

    def encode(self, inputs: str | Sequence, pooling_params: PoolingParams | None = None, *,
               truncate: bool = True, truncate_prompt_tokens: int | None = None,
               truncation_direction: str = "right", prompt: str | None = None,
               prompt_name: str | None = None, use_tqdm: bool | None = None,
               priority: int = 0) -> list[PoolingOutput]:
        """Run any task; `pooling_params.task` picks it (default: the model's task)."""
        params = pooling_params or PoolingParams()
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
            use_tqdm, priority)
        return [PoolingOutput(_as_numpy(r.data), r.num_tokens, r.extra["task"], r.request_id)
                for r in results]

    # ---- classify / token_classify / NER (issue 3) ---------------------------------------

    # ---- score / rerank (issue 4) ---------------------------------------------------------

    # ---- sparse embeddings (issue 7) ------------------------------------------------------

    def reload_weights(self) -> None:
        """Load the model folder's weights again, in place (after a fine-tune wrote them)."""
        self.core.reload_weights()

    # ---- plumbing -----------------------------------------------------------------------
    def verify_params(self, params: PoolingParams) -> PoolingParams:
        params = params.verify(self.model_config, self.default_task)
        if params.task not in self.supported_tasks:
            raise ValueError(f"Unsupported task: {params.task!r}. "
                             f"Supported tasks: {sorted(self.supported_tasks)}")
        return params

    def _encode(self, inputs, params: PoolingParams, truncation: TruncationOptions,
                prompt: str | None, prompt_name: str | None, use_tqdm: bool | None,
                priority: int, pairs: list[str] | None = None) -> list[RequestOutput]:
        params = self.verify_params(params)
        items = normalize_inputs(inputs)
        prompt_text = self.processor.resolve_prompt(prompt, prompt_name)
        processed = self.processor.process(items, pairs=pairs, truncation=truncation,
                                           prompt=prompt_text)
        return self.run_processed(processed, [params] * len(processed), priority, use_tqdm)

    def run_processed(self, processed: list[ProcessedInput], params: list[PoolingParams],
                      priority: int = 0, use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Submit already-processed inputs and step the engine until all of them finish."""
        batch_id = next(self._ids)
        request_ids = [f"offline-{batch_id}-{i}" for i in range(len(processed))]
        # Submit shortest first: with FCFS scheduling, each step then packs sequences of
        # similar length, so attention groups equal lengths into one kernel call (measured in
        # docs/benchmarks.md). Results are still returned in input order.
        order = sorted(range(len(processed)), key=lambda i: len(processed[i].prompt_token_ids))
        for i in order:
            req_id, item, p = request_ids[i], processed[i], params[i]
            self.core.add_request(Request(
                request_id=req_id, prompt_token_ids=item.prompt_token_ids,
                pooling_params=p, token_type_ids=item.token_type_ids,
                special_tokens_mask=item.special_tokens_mask,
                num_prompt_tokens=item.num_prompt_tokens, priority=priority))
        show = use_tqdm if use_tqdm is not None else len(processed) >= _TQDM_MIN_INPUTS
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(processed), disable=not show, desc="pooling", unit="input") as bar:
            while len(results) < len(request_ids):
                for output in self.core.step():
                    results[output.request_id] = output
                    bar.update(1)
        failures = [(i, results[r].error) for i, r in enumerate(request_ids) if results[r].error]
        if failures:
            index, error = failures[0]
            raise RuntimeError(f"{len(failures)} of {len(request_ids)} inputs failed; "
                               f"input {index}: {error}")
        ordered = [results[r] for r in request_ids]
        for output, p in zip(ordered, params):
            output.extra = {"task": p.task}
        return ordered


def _as_numpy(data) -> np.ndarray:
    array = data.float().numpy() if hasattr(data, "numpy") else np.asarray(data)
    return array.astype(np.float32, copy=False)
