"""`Engine`: the offline entry point. Validate and tokenize, submit, step until done, return
results in input order. Callers never batch or sort: the scheduler does."""
from __future__ import annotations

import functools
import itertools
import threading
import uuid
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from pooler.config import EngineConfig, ModelConfig, SchedulerConfig
from pooler.engine.core import EngineCore
from pooler.engine.engine_loop import EngineLoop, RequestCancelled
from pooler.engine.input_processor import (InputProcessor, ProcessedInput, TruncationOptions,
                                           normalize_inputs)
from pooler.engine.request import Request, RequestOutput
from pooler.engine.tokenizer import TextTokenizer
from pooler.model_folder import DEFAULT_MODEL
from pooler.outputs import (EmbeddingOutput, PoolingOutput, RerankResult, ScoreOutput,
                            TokenEmbeddingOutput)
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
        # Request ids are unique per engine instance and never taken from a client.
        self._id_prefix = uuid.uuid4().hex[:8]
        self._loop: EngineLoop | None = None
        self._step_lock = threading.Lock()

    # ---- background mode (server, multi-threaded callers) ------------------------------
    def start_background_loop(self) -> EngineLoop:
        """Run the core in a background thread: from now on every call from any thread
        feeds the same batches (continuous batching). The server uses this."""
        if self._loop is None:
            self._loop = EngineLoop(self.core)
        self._loop.start()
        return self._loop

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Finish in-flight requests and stop the background loop, if any."""
        if self._loop is not None:
            self._loop.shutdown(timeout)

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
    def score(self, queries: str | Sequence, documents: str | Sequence, *,
              truncate: bool = True, truncate_prompt_tokens: int | None = None,
              use_tqdm: bool | None = None, priority: int = 0,
              cancel: threading.Event | None = None) -> list[ScoreOutput]:
        """Score (query, document) pairs: 1 query x N documents, or N x N pairwise.

        ColBERT: MaxSim of token vectors (each query encoded once); cross-encoder: the
        classifier's relevance; embedding model: cosine similarity. With the background loop
        running, setting `cancel` aborts the call and releases everything it cached."""
        from pooler.engine import scoring

        return scoring.score(self, queries, documents, truncate=truncate,
                             truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                             priority=priority, cancel=cancel)

    def rerank(self, query: str | Sequence[int], documents: Sequence, *,
               top_n: int | None = None, return_documents: bool = False,
               **kwargs) -> list[RerankResult]:
        """Documents sorted by score, best first (ties keep input order); `top_n` keeps the
        best n. Takes score()'s keyword options."""
        from pooler.engine import scoring

        return scoring.rerank(self, query, documents, top_n=top_n,
                              return_documents=return_documents, **kwargs)

    def encode_queries(self, inputs: str | Sequence, *, use_tqdm: bool | None = None,
                       priority: int = 0) -> list[TokenEmbeddingOutput]:
        """ColBERT query token vectors, as PyLate's encode(is_query=True): marker, [MASK]
        expansion up to the query length, L2-normalized."""
        return self._colbert_encode(inputs, "query", use_tqdm, priority)

    def encode_documents(self, inputs: str | Sequence, *, use_tqdm: bool | None = None,
                         priority: int = 0) -> list[TokenEmbeddingOutput]:
        """ColBERT document token vectors, as PyLate's encode(is_query=False): marker,
        truncated to the document length, punctuation dropped, L2-normalized."""
        return self._colbert_encode(inputs, "document", use_tqdm, priority)

    @functools.cached_property
    def colbert_inputs(self):
        from pooler.colbert import ColBERTInputBuilder

        if self.model_config.colbert is None:
            raise ValueError(f"{self.model_config.model} is not a ColBERT model (no PyLate "
                             "config, Stanford artifact.metadata or colbert_mode).")
        return ColBERTInputBuilder(self.model_config.colbert, self.tokenizer,
                                   self.model_config.max_model_len)

    def _colbert_encode(self, inputs, role: str, use_tqdm, priority):
        from pooler.colbert import ROLE_KEY, UNATTENDED_KEY

        processed = self.colbert_inputs.build(normalize_inputs(inputs), role)
        params = [self.verify_params(PoolingParams(task="token_embed", extra={
            ROLE_KEY: role, UNATTENDED_KEY: int(p.extra.get(UNATTENDED_KEY, 0))}))
            for p in processed]
        results = self.run_processed(processed, params, priority, use_tqdm)
        return [TokenEmbeddingOutput(_as_numpy(r.data), r.num_tokens, r.request_id)
                for r in results]

    def reset_cache(self) -> None:
        """Free derived caches (tokenizer clones, device allocator blocks). Unlike
        reload_weights, this keeps cached ColBERT queries: they are in-flight request state."""
        self.tokenizer.clear_cache()
        self.core.model_runner.reset_caches()

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
                      priority: int = 0, use_tqdm: bool | None = None,
                      cancel: threading.Event | None = None,
                      raise_on_error: bool = True) -> list[RequestOutput]:
        """Submit already-processed inputs and wait until all of them finish.

        Without a background loop this thread steps the engine itself. With one, requests go
        to the loop and this thread waits; setting `cancel` aborts the requests not yet done
        and raises RequestCancelled. With raise_on_error=False, failed requests come back with
        `.error` set instead of raising."""
        batch_id = next(self._ids)
        request_ids = [f"{self._id_prefix}-{batch_id}-{i}" for i in range(len(processed))]
        requests = [Request(request_id=req_id, prompt_token_ids=item.prompt_token_ids,
                            pooling_params=p, token_type_ids=item.token_type_ids,
                            special_tokens_mask=item.special_tokens_mask,
                            num_prompt_tokens=item.num_prompt_tokens, priority=priority)
                    for req_id, item, p in zip(request_ids, processed, params)]
        show = use_tqdm if use_tqdm is not None else len(processed) >= _TQDM_MIN_INPUTS
        with tqdm(total=len(processed), disable=not show, desc="pooling", unit="input") as bar:
            if self._loop is not None and self._loop.is_running:
                results = self._wait_on_loop(requests, bar, cancel)
            else:
                results = self._step_until_done(requests, bar)
        failures = [(i, results[r].error) for i, r in enumerate(request_ids) if results[r].error]
        if failures and raise_on_error:
            index, error = failures[0]
            raise RuntimeError(f"{len(failures)} of {len(request_ids)} inputs failed; "
                               f"input {index}: {error}")
        ordered = [results[r] for r in request_ids]
        for output, p in zip(ordered, params):
            output.extra = {"task": p.task}
        return ordered


    def _step_until_done(self, requests: list[Request], bar) -> dict[str, RequestOutput]:
        with self._step_lock:  # one stepping thread at a time when no loop runs
            for request in requests:
                self.core.add_request(request)
            wanted = {r.request_id for r in requests}
            results: dict[str, RequestOutput] = {}
            while len(results) < len(wanted):
                for output in self.core.step():
                    if output.request_id in wanted:
                        results[output.request_id] = output
                        bar.update(1)
            return results

    def _wait_on_loop(self, requests: list[Request], bar,
                      cancel: threading.Event | None) -> dict[str, RequestOutput]:
        futures = dict(zip((r.request_id for r in requests), self._loop.submit(requests)))
        pending = set(futures.values())
        while pending:
            done, pending = wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)
            bar.update(len(done))
            if cancel is not None and cancel.is_set() and pending:
                self._loop.abort([rid for rid, f in futures.items() if not f.done()])
                raise RequestCancelled(f"{len(pending)} of {len(futures)} requests aborted")
        results = {}
        for req_id, future in futures.items():
            if future.cancelled():
                raise RequestCancelled(f"request {req_id} was aborted")
            results[req_id] = future.result()  # re-raises a submission error
        return results


def _as_numpy(data) -> np.ndarray:
    array = data.float().numpy() if hasattr(data, "numpy") else np.asarray(data)
    return array.astype(np.float32, copy=False)
