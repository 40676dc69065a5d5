"""`Engine`: the offline entry point. Validate and tokenize, submit, step until done, return
results in input order. Callers never batch or sort: the scheduler does."""
from __future__ import annotations

import functools
import itertools
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from pooler import architectures
from pooler.config import EngineConfig, ModelConfig, SchedulerConfig
from pooler.engine import long_inputs, scoring
from pooler.engine.core import EngineCore
from pooler.engine.engine_loop import (CancelledBeforeSubmit, EngineLoop, RequestCancelled,
                                       current_call)
from pooler.engine.input_processor import (InputProcessor, ProcessedInput, TruncationOptions,
                                           normalize_inputs)
from pooler.engine.lora import UnknownLoraError, check_family, with_lora
from pooler.engine.request import Request, RequestOutput
from pooler.gliner import PARAMS_KEY as GLINER_PARAMS_KEY
from pooler.gliner import (check_threshold, decode_spans, gliner_options_error,
                           labels_required_error, misplaced_options, normalize_labels,
                           spans_to_entities, split_words, token_options_error)
from pooler.model_folder import DEFAULT_MODEL
from pooler.ner import SubwordRules, check_strategy, extract_entities
from pooler.outputs import (BGEM3Output, BGEM3Score, ChunkEmbeddingOutput, ClassificationOutput,
                            EmbeddingOutput, Entity, PoolingOutput, RerankResult, ScoreOutput,
                            SparseEmbeddingOutput, TokenClassificationOutput,
                            TokenEmbeddingOutput, as_numpy)
from pooler.params import PoolingParams
from pooler.pooling.activation import labels_of
from pooler.quantize_output import check_precision, quantize_embeddings
from pooler.tasks import unsupported_task_message
from pooler.tokenizer import TextTokenizer


def _with_lora(params: PoolingParams, lora: str) -> PoolingParams:
    params = params.clone()
    params.lora = lora
    return params


class _NoProgress:
    """The part of tqdm's interface run_processed uses, doing nothing."""

    def __enter__(self) -> "_NoProgress":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


# Offline jobs at least this long show a progress bar unless use_tqdm says otherwise.
_TQDM_MIN_INPUTS = 100


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
        is not faster than float32 here ("fallback", "refuse" or "off"; README "Precision")."""
        self.model_config = ModelConfig(
            model=model, task=task, runner=runner, dtype=dtype, device=device,
            max_model_len=max_model_len, hf_overrides=hf_overrides, quantization=quantization,
            revision=revision, precision_check=precision_check)
        self.config = EngineConfig(
            self.model_config,
            SchedulerConfig.for_model(self.model_config, max_num_batched_tokens, max_num_seqs),
            num_threads=num_threads)
        lowercase = bool(self.model_config.st and self.model_config.st.do_lower_case)
        self.tokenizer = TextTokenizer(self.model_config.path, self.model_config.tokenizer_config,
                                       lowercase=lowercase)
        self.processor = InputProcessor(self.model_config, self.tokenizer)
        if lora_modules or enable_lora:
            self.config.scheduler_config.max_loras = max_loras
        self.core = EngineCore(self.config)
        self._lora_manager = None
        if lora_modules or enable_lora:
            check_family(architectures.get_arch_spec(self.model_config.architecture).family
                         if self.model_config.runner != "transformers" else "",
                         self.model_config.runner)
            self._lora_manager = self.core.model_runner.enable_lora(max_loras, max_lora_rank)
            for name, path in (lora_modules or {}).items():
                self._lora_manager.add(name, path)
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

    @property
    def default_task(self) -> str:
        return self.core.model_runner.pooling_runner.selected_task

    # ---- LoRA adapters (pooler/engine/lora.py, pooler/lora) -----------------------------
    @property
    def lora_enabled(self) -> bool:
        return self._lora_manager is not None

    @property
    def lora_names(self) -> list[str]:
        """The LoRA adapters served beside the base, by name."""
        return [] if self._lora_manager is None else self._lora_manager.names

    def check_lora(self, name: str) -> None:
        """UnknownLoraError (a ValueError naming the loaded ones) unless `name` is served."""
        if name not in self.lora_names:
            raise UnknownLoraError(name, self.lora_names)

    def add_lora(self, name: str, path: str, replace: bool = False) -> None:
        """Serve the PEFT LoRA folder at `path` as `name`, from the next step on (replace: in
        place of an adapter of that name). A ValueError naming the mismatch refuses an
        adapter made for another base, or whose ranks do not fit; nothing served changes."""
        if self._lora_manager is None:
            raise ValueError("this engine serves no LoRA adapters; create it with "
                             "lora_modules={...} or enable_lora=True (--enable-lora).")
        self._between_steps(lambda: self._lora_manager.add(name, path, replace))

    def remove_lora(self, name: str) -> None:
        """Stop serving `name` (requests still queued for it fail naming it)."""
        self.check_lora(name)
        self._between_steps(lambda: self._lora_manager.remove(name))

    # ---- public tasks -------------------------------------------------------------------
    @with_lora
    def embed(self, inputs: str | Sequence, *, dimensions: int | None = None,
              normalize: bool | None = None, use_activation: bool | None = None,
              truncate: bool = True, truncate_prompt_tokens: int | None = None,
              truncation_direction: str = "right", prompt: str | None = None,
              prompt_name: str | None = None, add_special_tokens: bool = True,
              use_tqdm: bool | None = None, priority: int = 0,
              long_input: str = "truncate", chunk_overlap: int = 0,
              precision: str = "float32", ranges=None,
              calibration_embeddings=None) -> list[EmbeddingOutput]:
        """use_activation: vLLM's name for normalize (False: the raw pooled vector).
        add_special_tokens=False: texts are tokenized without [CLS]/[SEP] and the like.
        long_input="chunk": an input longer than the model's max length is embedded in
        windows (sharing `chunk_overlap` tokens) whose vectors are averaged, weighted by their
        tokens (pooler/engine/long_inputs.py); the default truncates.
        precision: "float32", or "int8" / "uint8" (256 buckets per dimension between
        `ranges` [2, dim], else the min/max of `calibration_embeddings` [n, dim], else of this
        call's own embeddings) or "binary" / "ubinary" (bits packed 8 per byte), as
        sentence-transformers' quantize_embeddings."""
        check_precision(precision)
        params = PoolingParams(task="embed", dimensions=dimensions, normalize=normalize,
                               use_activation=use_activation)
        truncation = TruncationOptions(truncate, truncate_prompt_tokens, truncation_direction)
        if long_input not in long_inputs.LONG_INPUT_MODES:
            raise ValueError(f"long_input must be one of {list(long_inputs.LONG_INPUT_MODES)}, "
                             f"got {long_input!r}.")
        if long_input == "chunk":
            if not add_special_tokens:
                raise ValueError("long_input='chunk' puts the model's special tokens around "
                                 "every window: it needs add_special_tokens=True.")
            outputs = self._embed_chunked(inputs, params, truncation, prompt, prompt_name,
                                          chunk_overlap, use_tqdm, priority)
        else:
            results = self._encode(inputs, params, truncation, prompt, prompt_name, use_tqdm,
                                   priority, add_special_tokens=add_special_tokens)
            outputs = [EmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
                       for r in results]
        if precision != "float32" and outputs:
            codes = quantize_embeddings(np.stack([o.embedding for o in outputs]), precision,
                                        ranges, calibration_embeddings)
            for output, code in zip(outputs, codes):
                output.embedding = code
        return outputs

    @with_lora
    def embed_chunks(self, document: str, chunks: Sequence[tuple[int, int]] | None = None, *,
                     chunker: str = "sentences", normalize: bool | None = None,
                     dimensions: int | None = None, window_overlap: int | None = None,
                     use_tqdm: bool | None = None,
                     priority: int = 0) -> list[ChunkEmbeddingOutput]:
        """Late chunking: encode the whole document once (in windows overlapping by
        `window_overlap` tokens, default a quarter of the max length, when it is longer than
        the max length) and pool each chunk from the document's token states: the mean of the
        token vectors inside the chunk's character span, then Matryoshka truncation and
        normalization as for embed. `chunks`: (start, end) character spans; without them the
        document is cut into sentences (chunker="sentences"); a sentence with no token (only
        characters the tokenizer drops, e.g. control characters) has nothing to pool and is
        left out, so a document without any token has no chunks (an empty list)."""
        if not isinstance(document, str) or not document.strip():
            raise ValueError("document must be a non-empty string.")
        if chunks is None:
            if chunker != "sentences":
                raise ValueError(f"chunker must be 'sentences' (or pass chunks), got "
                                 f"{chunker!r}.")
            spans = long_inputs.sentence_spans(document)
        else:
            spans = long_inputs.check_chunks(chunks, document)
        final = self.verify_params(PoolingParams(task="embed", dimensions=dimensions,
                                                 normalize=normalize))
        token_params = self.verify_params(PoolingParams(task="token_embed", normalize=False))
        [item] = self.processor.process([document], whole=True)
        special = item.special_tokens_mask or [0] * len(item.prompt_token_ids)
        content_index = [i for i, m in enumerate(special) if not m]
        offsets = [item.offsets[i] for i in content_index]
        # Each span's content tokens, before any model work.
        insides = [long_inputs.tokens_in_span(offsets, [0] * len(offsets), s, e)
                   for s, e in spans]
        if chunks is None:  # the chunker's sentences: those without a token are left out
            spans, insides = [s for s, i in zip(spans, insides) if i], [i for i in insides if i]
            if not spans:
                return []
        for (start, end), inside in zip(spans, insides):
            if not inside:
                raise ValueError(f"chunk ({start}, {end}) covers no token of the document "
                                 "(only whitespace or characters the tokenizer drops).")
        max_len = self.model_config.max_model_len
        windows = long_inputs.split_into_windows(
            item, max_len, max_len // 4 if window_overlap is None else window_overlap,
            "window_overlap")
        results = self.run_processed(windows.inputs, [token_params] * len(windows.inputs),
                                     priority, use_tqdm)
        # Token vectors of the document's content tokens, each from its best window.
        num_content = sum(1 for m in special if not m)
        vectors = [as_numpy(r.data) for r in results]  # [window_len, dim] each
        picks = long_inputs.assign_tokens(num_content, windows.spans)
        content = np.stack([vectors[w][windows.num_prefix + i] for w, i in picks])
        out = []
        for (start, end), inside in zip(spans, insides):
            vector = content[inside].astype(np.float64).mean(0)
            out.append(ChunkEmbeddingOutput(
                long_inputs.finalize(vector, final.dimensions, final.normalize), start, end,
                document[start:end], len(inside), len(item.prompt_token_ids)))
        return out

    @with_lora
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
        return [TokenEmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
                for r in results]

    @with_lora
    def encode(self, inputs: str | Sequence, pooling_params: PoolingParams | None = None, *,
               truncate: bool = True, truncate_prompt_tokens: int | None = None,
               truncation_direction: str = "right", prompt: str | None = None,
               prompt_name: str | None = None, add_special_tokens: bool = True,
               use_tqdm: bool | None = None, priority: int = 0) -> list[PoolingOutput]:
        """Run any task; `pooling_params.task` picks it (default: the model's task)."""
        params = pooling_params or PoolingParams()
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
            use_tqdm, priority, add_special_tokens=add_special_tokens)
        return [PoolingOutput(as_numpy(r.data), r.num_tokens, r.extra["task"], r.request_id)
                for r in results]

    # ---- classify / token_classify / NER (issue 3) ---------------------------------------
    @with_lora
    def classify(self, inputs: str | Sequence, *, text_pair: str | list[str] | None = None,
                 use_activation: bool | None = None, truncate: bool = True,
                 truncate_prompt_tokens: int | None = None, add_special_tokens: bool = True,
                 max_pair_tokens: int | None = None, truncation_direction: str = "right",
                 use_tqdm: bool | None = None,
                 priority: int = 0) -> list[ClassificationOutput]:
        """Score each input (or each (input, text_pair) pair) against the model's labels.

        Activation as the model declares it (see pooler/pooling/activation.py);
        use_activation=False returns raw logits. max_pair_tokens cuts each text_pair to that
        many tokens before the pair is joined (a reranker's max_tokens_per_doc)."""
        items = normalize_inputs(inputs)
        pairs = self._check_pairs(items, text_pair)
        if max_pair_tokens is not None and pairs is None:
            raise ValueError("max_pair_tokens applies to sentence pairs; pass text_pair.")
        params = PoolingParams(task="classify", use_activation=use_activation)
        processed, results = self._run_texts(
            items, self.verify_params(params),
            TruncationOptions(truncate, truncate_prompt_tokens, truncation_direction),
            use_tqdm, priority, pairs=pairs, add_special_tokens=add_special_tokens,
            max_pair_tokens=max_pair_tokens)
        labels = labels_of(self.model_config.hf_config)
        outputs = []
        for r in results:
            probs = as_numpy(r.data)  # [num_labels]
            order = np.argsort(-probs, kind="stable")
            ranked = [{"label": labels[i], "score": float(probs[i])} for i in order]
            outputs.append(ClassificationOutput(probs, ranked[0]["label"], ranked[0]["score"],
                                                ranked, r.num_tokens, r.request_id))
        return outputs

    @with_lora
    def token_classify(self, inputs: str | Sequence, *, use_activation: bool | None = None,
                       skip_special_tokens: bool = False, truncate: bool = True,
                       truncate_prompt_tokens: int | None = None,
                       truncation_direction: str = "right", use_tqdm: bool | None = None,
                       priority: int = 0) -> list[TokenClassificationOutput]:
        """Label scores for every token ([num_tokens, num_labels] per input)."""
        items = normalize_inputs(inputs)
        params = PoolingParams(task="token_classify", use_activation=use_activation,
                               skip_special_tokens=skip_special_tokens)
        processed, results = self._run_texts(
            items, self.verify_params(params), TruncationOptions(
                truncate, truncate_prompt_tokens, truncation_direction),
            use_tqdm, priority)
        labels = labels_of(self.model_config.hf_config)
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
    def ner(self, inputs: str | list[str], *, labels: Sequence | None = None,
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
        if self.model_config.gliner is not None:
            return self._ner_gliner(items, labels, threshold, flat_ner, multi_label,
                                    aggregation_strategy, ignore_labels, ignore_subwords,
                                    truncate, truncate_prompt_tokens, truncation_direction,
                                    use_tqdm, priority)
        given = misplaced_options((("labels", labels, None), ("threshold", threshold, None),
                                   ("flat_ner", flat_ner, None),
                                   ("multi_label", multi_label, None)))
        if given:
            raise ValueError(gliner_options_error(given, "load",
                                                  self.model_config.architecture))
        check_strategy(aggregation_strategy, ignore_subwords)
        params = PoolingParams(task="token_classify", use_activation=True)
        processed, results = self._run_texts(
            items, self.verify_params(params), TruncationOptions(
                truncate, truncate_prompt_tokens, truncation_direction),
            use_tqdm, priority)
        label_names = labels_of(self.model_config.hf_config)
        rules = self._subword_rules = getattr(self, "_subword_rules", None) or \
            SubwordRules(self.tokenizer.backend)  # once per engine: may parse the vocabulary
        return [extract_entities(text, item.prompt_token_ids, as_numpy(r.data), item.offsets,
                                 item.special_tokens_mask, label_names, rules,
                                 aggregation_strategy, ignore_labels, ignore_subwords)
                for text, item, r in zip(items, processed, results)]

    def _ner_gliner(self, items: list[str], labels, threshold, flat_ner, multi_label,
                    aggregation_strategy, ignore_labels, ignore_subwords, truncate,
                    truncate_prompt_tokens, truncation_direction, use_tqdm,
                    priority) -> list[list[Entity]]:
        """Zero-shot NER with a GLiNER span model: each (text, labels) is one sequence in the
        engine's batches; the span head scores it, decoding runs here."""
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
        todo, built, results = self.gliner_span_scores(items, label_sets, truncate, use_tqdm,
                                                       priority)
        out: list[list[Entity]] = [[] for _ in items]
        for i, item, r in zip(todo, built, results):
            spans = decode_spans(as_numpy(r.data), len(item.words), item.labels, threshold,
                                 flat_ner, multi_label)
            out[i] = spans_to_entities(items[i], item.words, spans)
        return out

    def gliner_span_scores(self, items: list[str], label_sets: list[list[str]],
                           truncate: bool = True, use_tqdm: bool | None = None,
                           priority: int = 0):
        """Run (text, labels) pairs through a GLiNER model. Returns the indices of the texts
        that hold a word (the others have no span), their built inputs (words, labels) and
        their results, whose data is [num_words, max_width, num_labels] span probabilities."""
        started = time.perf_counter()
        todo = [i for i, text in enumerate(items) if split_words(text)]
        built = self.gliner_inputs.build([items[i] for i in todo], [label_sets[i] for i in todo],
                                         truncate, todo)
        call = current_call.get()
        if call is not None:
            call.tokenize_seconds += time.perf_counter() - started
        base = self.verify_params(PoolingParams(task="token_classify",
                                                extra={GLINER_PARAMS_KEY: {}}))
        params = []
        for item in built:
            p = base.clone()
            p.extra[GLINER_PARAMS_KEY] = item.head_inputs
            params.append(p)
        results = self.run_processed([b.processed for b in built], params, priority, use_tqdm)
        return todo, built, results

    @functools.cached_property
    def gliner_inputs(self):
        from pooler.engine.gliner_inputs import GLiNERInputBuilder

        if self.model_config.gliner is None:
            raise ValueError(f"{self.model_config.model} is not a GLiNER model (no "
                             "gliner_config.json).")
        return GLiNERInputBuilder(self.model_config.gliner, self.tokenizer,
                                  self.model_config.max_model_len)

    def _run_texts(self, items: list, params: PoolingParams, truncation: TruncationOptions,
                   use_tqdm: bool | None, priority: int, pairs: list[str] | None = None,
                   prompt: str | None = None, add_special_tokens: bool = True,
                   max_pair_tokens: int | None = None
                   ) -> tuple[list[ProcessedInput], list[RequestOutput]]:
        """Tokenize normalized items (the time goes to the caller's CallContext, for the
        server's metrics) and run them with verified params; returns the processed inputs
        (offsets, special-token masks) with the results."""
        started = time.perf_counter()
        processed = self.processor.process(items, pairs=pairs, truncation=truncation,
                                           prompt=prompt, add_special_tokens=add_special_tokens,
                                           max_pair_tokens=max_pair_tokens)
        call = current_call.get()
        if call is not None:
            call.tokenize_seconds += time.perf_counter() - started
        return processed, self.run_processed(processed, [params] * len(processed), priority,
                                             use_tqdm)

    def _check_pairs(self, items: list, text_pair) -> list[str] | None:
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
        reason = None if self.model_config.rerank_prompt else self._pair_incapable_reason()
        if reason:
            raise ValueError(f"text_pair was given, but this model does not take sentence "
                             f"pairs: {reason}. Pass single texts (join the two texts "
                             "yourself if the model was trained on such a format).")
        return list(pairs)

    def _pair_incapable_reason(self) -> str | None:
        if self.model_config.attn_type != "encoder_only":
            return "it is a decoder"
        if self.tokenizer.num_special_tokens_to_add(pair=True) <= \
                self.tokenizer.num_special_tokens_to_add(pair=False):
            return "its tokenizer puts no separator between two texts"
        if "type_vocab_size" not in self.model_config.hf_config:
            return None  # no token type embeddings (MPNet, DistilBERT): type ids are unused
        type_ids = self.tokenizer.encode_batch(["a"], ["b"])[0].token_type_ids
        type_vocab = int(self.model_config.hf_config.get("type_vocab_size", 1))
        # type_vocab_size 0 (DeBERTa-v3): no token-type embeddings, the ids are ignored and
        # the separator alone marks the second text, as transformers runs it.
        if type_vocab > 0 and max(type_ids) >= type_vocab:
            return (f"its tokenizer marks the second text with token type {max(type_ids)} but "
                    f"the model has type_vocab_size={type_vocab}")
        return None

    # ---- score / rerank (issue 4) ---------------------------------------------------------
    @with_lora
    def score(self, queries: str | Sequence, documents: str | Sequence, *,
              truncate: bool = True, truncate_prompt_tokens: int | None = None,
              truncation_direction: str = "right", use_tqdm: bool | None = None,
              priority: int = 0, cancel: threading.Event | None = None,
              use_activation: bool | None = None, bge_m3_mode: str | None = None,
              bge_m3_weights: Sequence[float] | None = None,
              max_tokens_per_doc: int | None = None) -> list[ScoreOutput]:
        """Score (query, document) pairs: 1 query x N documents, or N x N pairwise.
        max_tokens_per_doc: cut each document to that many tokens first (vLLM's option).

        ColBERT: MaxSim of token vectors (each query encoded once); cross-encoder: the
        classifier's relevance; embedding model: cosine similarity; BGE-M3: `bge_m3_mode`
        (default "colbert+sparse+dense") with `bge_m3_weights` (see score_bge_m3). With the
        background loop running, setting `cancel` aborts the call and releases everything it
        cached."""
        return scoring.score(self, queries, documents, truncate=truncate,
                             truncate_prompt_tokens=truncate_prompt_tokens,
                             truncation_direction=truncation_direction, use_tqdm=use_tqdm,
                             priority=priority, cancel=cancel,
                             use_activation=use_activation, bge_m3_mode=bge_m3_mode,
                             bge_m3_weights=bge_m3_weights,
                             max_tokens_per_doc=max_tokens_per_doc)

    # ---- BGE-M3 (issue 13) -------------------------------------------------------------------
    @with_lora
    def embed_bge_m3(self, inputs: str | Sequence, *,
                     outputs: Sequence[str] = ("dense", "sparse", "colbert"),
                     truncate: bool = True, truncate_prompt_tokens: int | None = None,
                     use_tqdm: bool | None = None, priority: int = 0) -> list[BGEM3Output]:
        """BGE-M3's dense vector, lexical weights and ColBERT vectors, any of them, from one
        forward pass per input (FlagEmbedding's BGEM3FlagModel.encode with return_dense /
        return_sparse / return_colbert_vecs)."""
        self._require_bge_m3()
        params = PoolingParams(task="embed", extra={"bge_m3": list(outputs)})
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens), None, None, use_tqdm, priority)
        out = []
        for r in results:
            data = r.data
            sparse = data.get("sparse")
            out.append(BGEM3Output(
                dense=as_numpy(data["dense"]) if "dense" in data else None,
                sparse=None if sparse is None else self._sparse_output(
                    sparse, r.num_tokens, r.request_id, self.tokenizer),
                colbert=as_numpy(data["colbert"]) if "colbert" in data else None,
                num_tokens=r.num_tokens, request_id=r.request_id))
        return out

    @with_lora
    def score_bge_m3(self, queries: str | Sequence, documents: str | Sequence, *,
                     weights: Sequence[float] | None = None, truncate: bool = True,
                     truncate_prompt_tokens: int | None = None, use_tqdm: bool | None = None,
                     priority: int = 0) -> list[BGEM3Score]:
        """Every score FlagEmbedding's compute_score gives for each (query, document) pair:
        dense, sparse, colbert, and the weighted "sparse+dense" and "colbert+sparse+dense"
        (weights for dense, sparse, colbert; default [1, 1, 1] as FlagEmbedding, the BGE-M3
        model card uses [0.4, 0.2, 0.4]). 1 query x N documents, or N x N pairwise."""
        self._require_bge_m3()
        return scoring.bge_m3_scores(self, scoring.pair_inputs(queries, documents),
                                     TruncationOptions(truncate, truncate_prompt_tokens),
                                     weights, use_tqdm, priority)

    def _require_bge_m3(self) -> None:
        if self.model_config.bge_m3 is None:
            if self.model_config.runner != "native":
                raise ValueError("BGE-M3's sparse and ColBERT heads run on the native runner; "
                                 "drop runner='transformers'.")
            raise ValueError(f"{self.model_config.model} is not a BGE-M3 model: its folder has "
                             "no colbert_linear.pt and sparse_linear.pt beside the checkpoint.")

    @with_lora
    def rerank(self, query: str | Sequence[int], documents: Sequence, *,
               top_n: int | None = None, return_documents: bool = False,
               truncate: bool = True, truncate_prompt_tokens: int | None = None,
               truncation_direction: str = "right", use_tqdm: bool | None = None,
               priority: int = 0, cancel: threading.Event | None = None,
               use_activation: bool | None = None, bge_m3_mode: str | None = None,
               bge_m3_weights: Sequence[float] | None = None,
               max_tokens_per_doc: int | None = None) -> list[RerankResult]:
        """Documents sorted by score, best first (ties keep input order); `top_n` keeps the
        best n. The other options are score()'s (named here, so callers can see which)."""
        return scoring.rerank(self, query, documents, top_n=top_n,
                              return_documents=return_documents, truncate=truncate,
                              truncate_prompt_tokens=truncate_prompt_tokens,
                              truncation_direction=truncation_direction, use_tqdm=use_tqdm,
                              priority=priority, cancel=cancel, use_activation=use_activation,
                              bge_m3_mode=bge_m3_mode, bge_m3_weights=bge_m3_weights,
                              max_tokens_per_doc=max_tokens_per_doc)

    @with_lora
    def encode_queries(self, inputs: str | Sequence, *, use_tqdm: bool | None = None,
                       priority: int = 0) -> list[TokenEmbeddingOutput]:
        """ColBERT query token vectors, as PyLate's encode(is_query=True): marker, [MASK]
        expansion up to the query length, L2-normalized."""
        return self._colbert_encode(inputs, "query", use_tqdm, priority)

    @with_lora
    def encode_documents(self, inputs: str | Sequence, *, use_tqdm: bool | None = None,
                         priority: int = 0) -> list[TokenEmbeddingOutput]:
        """ColBERT document token vectors, as PyLate's encode(is_query=False): marker,
        truncated to the document length, punctuation dropped, L2-normalized."""
        return self._colbert_encode(inputs, "document", use_tqdm, priority)

    @functools.cached_property
    def colbert_inputs(self):
        from pooler.engine.colbert_inputs import ColBERTInputBuilder

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
        return [TokenEmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
                for r in results]

    def reset_cache(self) -> None:
        """Free derived caches (tokenizer clones, device allocator blocks). Unlike
        reload_weights and reset_encoder_cache, this keeps cached ColBERT queries: they are
        in-flight request state."""
        self.tokenizer.clear_cache()
        self.core.model_runner.reset_caches()

    def reset_encoder_cache(self) -> None:
        """The model runner's reset_encoder_cache, between steps: drops every cached ColBERT
        query (in-flight scoring calls whose documents have not run yet then fail)."""
        self._between_steps(self.core.model_runner.reset_encoder_cache)

    def reset_mm_cache(self) -> None:
        """The model runner's reset_mm_cache, between steps: pooler serves text models, so
        there is nothing to reset, and cached ColBERT queries stay."""
        self._between_steps(self.core.model_runner.reset_mm_cache)

    # ---- sparse embeddings (issue 7) ------------------------------------------------------
    @with_lora
    def embed_sparse(self, inputs: str | Sequence, *, top_k: int | None = None,
                     threshold: float | None = None, pooling: str | None = None,
                     skip_special_tokens: bool = False, query: bool = False,
                     truncate: bool = True, truncate_prompt_tokens: int | None = None,
                     truncation_direction: str = "right", prompt: str | None = None,
                     prompt_name: str | None = None, use_tqdm: bool | None = None,
                     priority: int = 0) -> list[SparseEmbeddingOutput]:
        """SPLADE sparse embeddings of a *ForMaskedLM model, as {token_id: weight} per input.

        top_k / threshold: keep the k largest weights / weights above the threshold.
        pooling: "max" (default unless the model declares "sum") or "sum" over tokens.
        skip_special_tokens: leave [CLS]/[SEP] out of the pooling (included by default, as
        sentence-transformers and the original SPLADE do).
        query: encode as a query; an inference-free model (a sentence-transformers Router with a
        SparseStaticEmbedding query route) then uses its static token weights, no forward pass.
        """
        from pooler.pooling.sparse import SparseOptions, prune

        options = SparseOptions(pooling=pooling, top_k=top_k, threshold=threshold).validated()
        if self.model_config.head != "mlm":
            raise ValueError(
                f"embed_sparse needs a masked-LM model (*ForMaskedLM, e.g. a SPLADE model such "
                f"as naver/splade-cocondenser-ensembledistil); this model "
                f"({self.model_config.architecture}) has no vocabulary head. Load such a "
                "model: Engine('path/or/hub-name') in Python, `pooler sparse --model PATH` on "
                "the command line, or serve it with `pooler serve PATH` (/embed_sparse).")
        static = self._static_query_encoder() if query else None
        if static is not None:
            texts = normalize_inputs(inputs)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("inference-free queries must be texts, not token ids.")
            vectors = static.encode(texts)
            return [self._sparse_output(prune(v, top_k, threshold), n, f"static-{i}",
                                        static.tokenizer)
                    for i, (v, n) in enumerate(vectors)]
        params = PoolingParams(task="embed", skip_special_tokens=skip_special_tokens,
                               extra={"sparse": options.as_extra()})
        results = self._encode(inputs, params, TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
            use_tqdm, priority)
        return [self._sparse_output(r.data, r.num_tokens, r.request_id, self.tokenizer)
                for r in results]

    def _static_query_encoder(self):
        if not hasattr(self, "_static_query"):
            from pooler.pooling.sparse_static import StaticSparseEncoder
            from pooler.sparse_layout import read_splade_layout

            path = read_splade_layout(self.model_config.root_path).query_static_path
            self._static_query = StaticSparseEncoder(path) if path is not None else None
        return self._static_query

    @staticmethod
    def _sparse_output(vector, num_tokens: int, request_id: str,
                       tokenizer: TextTokenizer) -> SparseEmbeddingOutput:
        dense = as_numpy(vector)                          # [vocab]
        indices = np.flatnonzero(dense)
        order = np.lexsort((indices, -dense[indices]))     # weight descending, then id
        indices = indices[order].astype(np.int64)
        return SparseEmbeddingOutput(
            indices=indices, values=dense[indices],
            tokens=[tokenizer.id_to_token(int(i)) or "" for i in indices],
            num_tokens=num_tokens, request_id=request_id)

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

    def _embed_chunked(self, inputs, params: PoolingParams, truncation: TruncationOptions,
                       prompt: str | None, prompt_name: str | None, overlap: int,
                       use_tqdm: bool | None, priority: int) -> list[EmbeddingOutput]:
        """Embed over-long inputs window by window; every window of every input runs in the
        same engine batches. Windows are pooled raw (no normalization, full size), averaged
        with their token counts as weights, then truncated and normalized as asked."""
        final = self.verify_params(params)
        if final.extra.get("sparse"):
            raise ValueError("long_input='chunk' applies to dense embeddings, not sparse ones.")
        raw = final.clone()
        raw.normalize, raw.dimensions = False, None
        items = normalize_inputs(inputs)
        prompt_text = self.processor.resolve_prompt(prompt, prompt_name)
        processed = self.processor.process(items, truncation=truncation, prompt=prompt_text,
                                           whole=True)
        limit = self.processor.max_length_for(truncation)
        groups = [long_inputs.split_into_windows(p, limit, overlap)
                  if len(p.prompt_token_ids) > limit else None for p in processed]
        flat = [w for p, g in zip(processed, groups) for w in (g.inputs if g else [p])]
        results = iter(self.run_processed(flat, [raw] * len(flat), priority, use_tqdm))
        out = []
        for p, group in zip(processed, groups):
            if group is None:
                r = next(results)
                vector, tokens = as_numpy(r.data).astype(np.float64), r.num_tokens
            else:
                window_results = [next(results) for _ in group.inputs]
                vector = long_inputs.weighted_mean([as_numpy(r.data) for r in window_results],
                                                   [e - s for s, e in group.spans])
                tokens = sum(r.num_tokens for r in window_results)
            out.append(EmbeddingOutput(
                long_inputs.finalize(vector, final.dimensions, final.normalize), tokens))
        return out

    def _encode(self, inputs, params: PoolingParams, truncation: TruncationOptions,
                prompt: str | None, prompt_name: str | None, use_tqdm: bool | None,
                priority: int, pairs: list[str] | None = None,
                add_special_tokens: bool = True) -> list[RequestOutput]:
        params = self.verify_params(params)
        items = normalize_inputs(inputs)
        prompt_text = self.processor.resolve_prompt(prompt, prompt_name)
        return self._run_texts(items, params, truncation, use_tqdm, priority, pairs,
                               prompt_text, add_special_tokens)[1]

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
        lora = call.lora if call is not None else None
        if lora is not None:  # the call's adapter, on every request it submits
            params = [p if p.lora == lora else _with_lora(p, lora) for p in params]
        for name in {p.lora for p in params} - {None}:
            self.check_lora(name)
        if call is not None and call.admit is not None and self._loop is not None:
            call.admit(sum(len(p.prompt_token_ids) for p in processed))
        batch_id = next(self._ids)
        request_ids = [f"{self._id_prefix}-{batch_id}-{i}" for i in range(len(processed))]
        # Submit shortest first: with FCFS scheduling, each step then packs sequences of
        # similar length, so attention groups equal lengths into one kernel call (measured in
        # docs/benchmarks.md). Results are still returned in input order.
        order = sorted(range(len(processed)), key=lambda i: len(processed[i].prompt_token_ids))
        requests = [Request(request_id=request_ids[i],
                            prompt_token_ids=processed[i].prompt_token_ids,
                            pooling_params=params[i], token_type_ids=processed[i].token_type_ids,
                            special_tokens_mask=processed[i].special_tokens_mask,
                            num_prompt_tokens=processed[i].num_prompt_tokens, priority=priority)
                    for i in order]
        if call is not None:
            call.submitted.update(p.task for p in params)
        show = use_tqdm if use_tqdm is not None else len(processed) >= _TQDM_MIN_INPUTS
        # A disabled tqdm still costs ~40 us to build: skip it for the one-query calls.
        progress = tqdm(total=len(processed), desc="pooling", unit="input") if show \
            else _NoProgress()
        with progress as bar:
            if self._loop is not None and self._loop.is_running:
                results = self._wait_on_loop(requests, bar, cancel)
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


