"""`Engine`: the offline entry point. Validate and tokenize, submit, step until done, return
results in input order. Callers never batch or sort: the scheduler does."""
from __future__ import annotations

import functools
import itertools
import threading
import uuid
from typing import Any

from pooler.config import EngineConfig, ModelConfig, SchedulerConfig
from pooler.engine import image_inputs, lora, page_inputs
from pooler.engine.core import EngineCore
from pooler.engine.engine_loop import CancelledBeforeSubmit, EngineLoop, current_call
from pooler.engine.input_processor import InputProcessor, ProcessedInput
from pooler.engine.lora import on_adapter, start_adapters, start_task_adapters
from pooler.engine.progress import progress_bar
from pooler.engine.request import Request, RequestOutput
from pooler.engine.tasks import (bge_m3, chunking, classification, embedding,
                                 late_interaction, scoring, sparse, token_classification,
                                 zero_shot_ner)
from pooler.model_folder import DEFAULT_MODEL
from pooler.params import PoolingParams
from pooler.tasks import unsupported_task_message
from pooler.tokenizer import TextTokenizer


class Engine:
    """Serve a pooling model offline.

    >>> engine = Engine("sentence-transformers/all-MiniLM-L6-v2")
    >>> engine.embed(["a sentence", "another"])[0].embedding.shape
    (384,)
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, task: str | None = None,
                 runner: str = "auto", dtype: str = "float32", device: str = "auto",
                 max_model_len: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int = 256, num_threads: int | None = None,
                 hf_overrides: dict[str, Any] | None = None, quantization: str | None = None,
                 revision: str | None = None, precision_check: str = "fallback",
                 lora_modules: dict[str, str] | None = None,
                 enable_lora: bool = False, max_loras: int = 8, max_lora_rank: int = 64):
        """lora_modules: {name: PEFT LoRA folder} served beside the base; a task call picks one
        with `lora="name"` (requests for different adapters share the same batches).
        enable_lora: serve adapters added later (add_lora) even when lora_modules is empty.
        max_loras: adapters held in memory at once (others are read from disk when asked for,
        least recently used dropped first) and at most in one batch; max_lora_rank: the
        largest rank accepted. precision_check: what a requested int8 or bfloat16 does where it
        is not faster than float32 here ("fallback", "refuse" or "off"; docs/models/precision.md).
        A model folder that carries task adapters (jina-embeddings-v3) serves all of them
        without lora_modules: `embed(..., task="retrieval.query")` picks one per call
        (Engine.task_adapters lists them)."""
        self.model_config = ModelConfig(
            model=model, task=task, runner=runner, dtype=dtype, device=device,
            max_model_len=max_model_len, hf_overrides=hf_overrides, quantization=quantization,
            revision=revision, precision_check=precision_check)
        self.config = EngineConfig(
            self.model_config,
            SchedulerConfig.for_model(self.model_config, max_num_batched_tokens, max_num_seqs),
            num_threads=num_threads)
        lowercase = bool(self.model_config.st and self.model_config.st.do_lower_case) or \
            bool(self.model_config.two_tower and self.model_config.two_tower.lowercase)
        self.tokenizer = TextTokenizer(self.model_config.path, self.model_config.tokenizer_config,
                                       lowercase=lowercase)
        self.processor = InputProcessor(self.model_config, self.tokenizer)
        if lora_modules or enable_lora:
            self.config.scheduler_config.max_loras = max_loras
        self.core = EngineCore(self.config)
        # Image-text models: media decoding, preprocessing and the mm cache (None otherwise).
        self.images = image_inputs.ImageInputs.for_engine(self)
        # Page retrieval models (ColModernVBert): queries, pages and the mm cache (else None).
        self.pages = page_inputs.PageInputs.for_engine(self)
        self._lora_manager = start_adapters(self.core, self.model_config, lora_modules,
                                            max_loras, max_lora_rank) \
            if lora_modules or enable_lora else None
        # Adapters loaded by name (lora_modules, add_lora); the model's own task adapters
        # (Jina v3's) are served beside them by the same manager.
        self._user_lora = self._lora_manager is not None
        self._lora_manager = start_task_adapters(self.core, self.model_config) \
            or self._lora_manager
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
            self._loop.idle_listeners.append(self.core.release_memory)
        self._loop.start()
        return self._loop

    @property
    def num_queued_tokens(self) -> int:
        """Tokens submitted to the background loop and not finished yet (0 without a loop)."""
        return self._loop.queued_tokens if self._loop is not None else 0

    def tokens_per_second(self) -> float | None:
        """The background loop's measured rate over its last steps (None before any step)."""
        return self._loop.tokens_per_second() if self._loop is not None else None

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Finish in-flight requests and stop the background loop, if any."""
        if self._loop is not None:
            self._loop.shutdown(timeout)

    # ---- facts --------------------------------------------------------------------------
    @property
    def supported_tasks(self) -> frozenset[str]:
        return self.core.model_runner.supported_tasks

    @property
    def embedding_size(self) -> int | None:
        """Length of an `embed` vector before any `dimensions` truncation (after the model's
        Dense projections; the vocabulary size for a declared SPLADE model); None when the
        model has no embed task. The runner's embed pooler says it."""
        return self.core.model_runner.output_size("embed")

    @property
    def precision_path(self) -> str:
        """What computes the model's GEMMs: "float32", "onednn-bf16 (avx512_bf16)", "float32
        (bf16 fallback)" when the load-time check kept fp32, ... (the fallback runner: its
        dtype)."""
        model = getattr(self.core.model_runner, "model", None)
        return getattr(model, "precision_path", None) or self.model_config.dtype

    def step_paths(self) -> dict[str, str]:
        """What each range of step sizes runs, in order of size: {"1-64 tokens": "int8 C stack
        (avx512-vnni)", "65+ tokens": "int8 layers (avx512-vnni)"}, {"1-48 tokens": "fp32 C
        stack (avx512)", "49+ tokens": "fp32 layers (oneDNN)"}, or {"all steps": ...}."""
        return self.core.model_runner.step_paths()

    @property
    def default_task(self) -> str:
        return self.core.model_runner.pooling_runner.selected_task

    # ---- LoRA adapters and task adapters: the runner's manager (pooler/engine/lora.py) ----
    lora_enabled = property(lora.lora_enabled)
    lora_names = property(lora.lora_names)
    task_adapters = property(lora.task_adapters)
    task_instructions = functools.cached_property(lora.task_instructions)
    check_task_adapter = lora.check_task_adapter
    check_lora = lora.check_lora
    add_lora = lora.add_lora
    remove_lora = lora.remove_lora

    # ---- tasks: each family's module (pooler/engine/tasks/) builds its inputs and params
    # and shapes its outputs; the engine runs them. A new task: a new module, one line here.
    embed = embedding.embed
    token_embed = embedding.token_embed
    encode = embedding.encode
    embed_chunks = chunking.embed_chunks
    classify = classification.classify
    token_classify = token_classification.token_classify
    ner = token_classification.ner
    _subword_rules = functools.cached_property(token_classification.subword_rules)
    gliner_span_scores = zero_shot_ner.gliner_span_scores
    gliner_inputs = functools.cached_property(zero_shot_ner.gliner_input_builder)
    score = scoring.score
    rerank = scoring.rerank
    encode_queries = late_interaction.encode_queries
    encode_documents = late_interaction.encode_documents
    colbert_inputs = functools.cached_property(late_interaction.colbert_input_builder)
    embed_sparse = sparse.embed_sparse
    _static_query_encoder = functools.cached_property(sparse.static_query_encoder)
    embed_bge_m3 = bge_m3.embed_bge_m3
    score_bge_m3 = bge_m3.score_bge_m3

    # ---- caches and weights -------------------------------------------------------------
    def reset_cache(self) -> None:
        """Free derived caches (tokenizer clones, device allocator blocks). Unlike
        reload_weights and reset_encoder_cache, this keeps cached ColBERT queries: they are
        in-flight request state."""
        self.tokenizer.clear_cache()
        self.core.model_runner.reset_caches()

    image_side = property(image_inputs.image_side)
    image_cache_stats = image_inputs.cache_stats

    def reset_encoder_cache(self) -> None:
        """The model runner's reset_encoder_cache, between steps: drops the encoder cache
        (vision-tower outputs of an image-text model) and every cached ColBERT query
        (in-flight scoring calls whose documents have not run yet then fail)."""
        self._between_steps(self.core.model_runner.reset_encoder_cache)

    def reset_mm_cache(self) -> None:
        """The model runner's reset_mm_cache, between steps: drops the multimodal input cache
        (preprocessed images of an image-text model); the encoder cache and cached ColBERT
        queries stay."""
        self._between_steps(self.core.model_runner.reset_mm_cache)

    def reload_weights(self) -> None:
        """Load the model folder's weights again, in place (after a fine-tune wrote them),
        between steps; the runner then resets its caches (reset_encoder_cache drops cached
        ColBERT queries)."""
        self._between_steps(self.core.reload_weights)

    # ---- plumbing -----------------------------------------------------------------------
    def verify_params(self, params: PoolingParams) -> PoolingParams:
        """The one check of a request's params against this model (the server relies on it):
        defaults filled, `dimensions` positive and at most the vector size, task supported."""
        params = params.verify(self.model_config, self.default_task)  # dimensions > 0
        if params.task in self.supported_tasks:
            self.core.model_runner.check_params(params)  # e.g. dimensions on sparse vectors
        size = (self.core.model_runner.output_size(params.task)
                if params.dimensions is not None else None)
        if size is not None and params.dimensions > size:
            what = "embedding" if params.task == "embed" else "token embedding"
            raise ValueError(f"dimensions={params.dimensions} is larger than the model's "
                             f"{what} size {size}; use a value <= {size}.")
        if params.task not in self.supported_tasks:
            raise ValueError(unsupported_task_message(
                params.task, self.supported_tasks, self.default_task,
                self.model_config.architecture))
        return params

    def run_processed(self, processed: list[ProcessedInput], params: list[PoolingParams],
                      priority: int = 0, use_tqdm: bool | None = None,
                      cancel: threading.Event | None = None,
                      raise_on_error: bool = True) -> list[RequestOutput]:
        """Submit already-processed inputs and wait until all of them finish.

        Without a background loop this thread steps the engine itself. With one, requests go
        to the loop and this thread waits; setting `cancel` aborts the requests not yet done
        and raises RequestCancelled. With raise_on_error=False, failed requests come back with
        `.error` set instead of raising. Without `cancel`, the caller's CallContext (see
        engine_loop.current_call) supplies one, so every Engine method is cancellable."""
        call = current_call.get()
        if cancel is None and call is not None:
            cancel = call.cancel
        if cancel is not None and cancel.is_set():  # the caller left before its turn
            raise CancelledBeforeSubmit("cancelled before its inputs were submitted")
        adapter = call.lora if call is not None else None
        if adapter is not None:  # the call's adapter, on every request it submits
            params = [on_adapter(p, adapter) for p in params]
        for name in {p.lora for p in params} - {None}:
            self.check_lora(name)
        if call is not None and call.admit is not None and self._loop is not None:
            call.admit(sum(image_inputs.num_tokens(p) for p in processed))
        batch_id = next(self._ids)
        request_ids = [f"{self._id_prefix}-{batch_id}-{i}" for i in range(len(processed))]
        # Submit shortest first: with FCFS scheduling, each step then packs sequences of
        # similar length, so attention groups equal lengths into one kernel call (measured in
        # docs/dev/journal.md). Results are still returned in input order.
        order = sorted(range(len(processed)), key=lambda i: len(processed[i].prompt_token_ids))
        requests = [Request(request_id=request_ids[i],
                            prompt_token_ids=processed[i].prompt_token_ids,
                            pooling_params=params[i], token_type_ids=processed[i].token_type_ids,
                            special_tokens_mask=processed[i].special_tokens_mask,
                            num_prompt_tokens=processed[i].num_prompt_tokens, priority=priority,
                            image=processed[i].extra.get("image"))
                    for i in order]
        if call is not None:
            call.submitted.update(p.task for p in params)
        with progress_bar(len(processed), use_tqdm) as bar:
            if self._loop is not None and self._loop.is_running:
                results = self._loop.run_to_completion(requests, bar, cancel)
            else:
                results = self._step_until_done(requests, bar)
        ordered = [results[r] for r in request_ids]
        for output, p in zip(ordered, params):
            output.extra = {"task": p.task}
        if call is not None:
            call.finished.extend(ordered)
        failures = [(i, results[r].error) for i, r in enumerate(request_ids) if results[r].error]
        if failures and raise_on_error:
            index, error = failures[0]
            raise RuntimeError(f"{len(failures)} of {len(request_ids)} inputs failed; "
                               f"input {index}: {error}")
        return ordered

    def drop_cached_queries(self, keys: list[str]) -> None:
        """Drop ColBERT queries from the late-interaction cache once every request submitted
        so far has taken effect (behind any pending abort). Does not wait."""
        late_interaction = self.core.model_runner.pooling_runner.late_interaction
        self._between_steps(lambda: late_interaction.drop_queries(keys), wait=False)

    def _between_steps(self, fn, wait: bool = True) -> None:
        """Run `fn` where no step is running: on the background loop's thread (after
        everything submitted before it), else under the step lock."""
        if self._loop is not None and self._loop.is_running:
            done = self._loop.call_soon(fn)
            if wait:
                done.result()
        else:
            with self._step_lock:
                fn()

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
