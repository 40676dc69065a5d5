"""TEI's and vLLM's metric names, beside pooler's own in the same registry, so the dashboards
and alerts operators already run against text-embeddings-inference or vLLM keep working.

TEI (router/src and core/src of text-embeddings-inference; durations in seconds):
- te_request_count{method}, te_request_success{method}: inference requests received and
  answered, method "single" (one input) or "batch";
- te_request_failure{err}: refused or failed requests by kind: validation, batch_size,
  model_type, overloaded, dropped (the client left), inference (a server error);
- te_embed_count / te_embed_success, te_predict_count / te_predict_success: engine inputs of
  embedding tasks and of classification tasks (per input, as TEI counts per inner call);
- histograms te_request_duration, te_request_tokenization_duration,
  te_request_queue_duration, te_request_inference_duration (per answered request; the queue
  and inference times are the means over its inputs, as TEI's batch routes report them),
  te_request_input_length (tokens per input), te_batch_next_size, te_batch_next_tokens (per
  engine step); the gauge te_queue_size (inputs waiting in the engine).
TEI's exporter (the Rust `metrics-exporter-prometheus`) writes counters without the `_total`
suffix prometheus_client adds, so `render` writes those families itself.

vLLM (vllm/v1/metrics/loggers.py; labels model_name and engine="0"):
- gauges vllm:num_requests_running, vllm:num_requests_waiting;
- counters vllm:prompt_tokens (tokens computed per step), vllm:request_success
  {finished_reason="stop"} (exposed with `_total`, as vLLM's prometheus_client does);
- histograms vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
  vllm:request_inference_time_seconds, vllm:request_prompt_tokens, per engine request.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

# Buckets as each project builds them.
_TEI_DURATION_BUCKETS = tuple(0.00001 * 1.5 ** (i + 1) for i in range(35))
_TEI_BATCH_SIZE_BUCKETS = tuple(float(2 ** i) for i in range(13))
_TEI_BATCH_TOKENS_BUCKETS = tuple(float(2 ** i) for i in range(21))
_VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                         50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# TEI counters, written without `_total` (see the module docstring).
TEI_COUNTERS = ("te_request_count", "te_request_success", "te_request_failure",
                "te_embed_count", "te_embed_success", "te_predict_count",
                "te_predict_success")

# Engine tasks TEI counts under te_embed_* and under te_predict_*.
_EMBED_TASKS = frozenset({"embed", "token_embed"})
_PREDICT_TASKS = frozenset({"classify", "score", "token_classify"})

# Routes that run no model (TEI counts no request for its tokenizer routes either).
_NOT_INFERENCE = frozenset({"/tokenize", "/detokenize", "/decode"})


def is_inference_route(method: str, route: str) -> bool:
    return method == "POST" and route != "unmatched" and route not in _NOT_INFERENCE


def failure_kind(status: int) -> str:
    """TEI's `err` label for an HTTP status (gRPC calls pass through the same routes)."""
    if status == 413:
        return "batch_size"
    if status == 424:
        return "model_type"
    if status in (429, 503):
        return "overloaded"
    if status in (408, 499):
        return "dropped"
    if status >= 500:
        return "inference"
    return "validation"


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(out)
            out.append(mantissa * scale)
        scale *= 10


class PeerMetrics:
    """TEI's and vLLM's families, registered on pooler's registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int):
        r = registry
        # ---- TEI -------------------------------------------------------------------------
        self.te_request_count = Counter("te_request_count", "inference requests received",
                                        ["method"], registry=r)
        self.te_request_success = Counter("te_request_success", "inference requests answered",
                                          ["method"], registry=r)
        self.te_request_failure = Counter("te_request_failure",
                                          "inference requests refused or failed, by kind",
                                          ["err"], registry=r)
        self.te_embed_count = Counter("te_embed_count", "inputs of embedding tasks submitted",
                                      registry=r)
        self.te_embed_success = Counter("te_embed_success",
                                        "inputs of embedding tasks computed", registry=r)
        self.te_predict_count = Counter("te_predict_count",
                                        "inputs of classification tasks submitted", registry=r)
        self.te_predict_success = Counter("te_predict_success",
                                          "inputs of classification tasks computed", registry=r)

        def tei_duration(name, doc):
            return Histogram(name, doc, buckets=_TEI_DURATION_BUCKETS, registry=r)

        self.te_request_duration = tei_duration("te_request_duration",
                                                "seconds from receiving a request to its answer")
        self.te_request_tokenization_duration = tei_duration(
            "te_request_tokenization_duration", "seconds a request spent tokenizing")
        self.te_request_queue_duration = tei_duration(
            "te_request_queue_duration", "seconds a request's inputs waited in the engine "
                                         "(mean over its inputs)")
        self.te_request_inference_duration = tei_duration(
            "te_request_inference_duration", "seconds of the engine steps that computed a "
                                             "request's inputs (mean over its inputs)")
        length_buckets = [float(2 ** i) for i in range(20) if 2 ** i <= max_model_len]
        self.te_request_input_length = Histogram(
            "te_request_input_length", "tokens per input", buckets=length_buckets or [1.0],
            registry=r)
        self.te_batch_next_size = Histogram("te_batch_next_size", "inputs per engine step",
                                            buckets=_TEI_BATCH_SIZE_BUCKETS, registry=r)
        self.te_batch_next_tokens = Histogram("te_batch_next_tokens", "tokens per engine step",
                                              buckets=_TEI_BATCH_TOKENS_BUCKETS, registry=r)
        self.te_queue_size = Gauge("te_queue_size", "inputs waiting in the engine",
                                   registry=r)
        # ---- vLLM ------------------------------------------------------------------------
        labels = ["model_name", "engine"]
        values = (model_name, "0")
        self.vllm_running = Gauge("vllm:num_requests_running",
                                  "Number of requests in model execution batches.", labels,
                                  registry=r).labels(*values)
        self.vllm_waiting = Gauge("vllm:num_requests_waiting",
                                  "Number of requests waiting to be processed.", labels,
                                  registry=r).labels(*values)
        self.vllm_prompt_tokens = Counter("vllm:prompt_tokens",
                                          "Number of prefill tokens processed.", labels,
                                          registry=r).labels(*values)
        self.vllm_request_success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            labels + ["finished_reason"], registry=r).labels(*values, "stop")

        def vllm_latency(name, doc):
            return Histogram(name, doc, labels, buckets=_VLLM_LATENCY_BUCKETS,
                             registry=r).labels(*values)

        self.vllm_e2e = vllm_latency("vllm:e2e_request_latency_seconds",
                                     "Histogram of e2e request latency in seconds.")
        self.vllm_queue = vllm_latency("vllm:request_queue_time_seconds",
                                       "Histogram of time spent in WAITING phase for request.")
        self.vllm_inference = vllm_latency(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.")
        self.vllm_request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
            buckets=build_1_2_5_buckets(max_model_len), registry=r).labels(*values)

    # ---- engine loop listeners (the loop thread) ------------------------------------------
    def on_step(self, num_requests: int, num_tokens: int, seconds: float) -> None:
        self.te_batch_next_size.observe(num_requests)
        self.te_batch_next_tokens.observe(num_tokens)
        self.vllm_prompt_tokens.inc(num_tokens)

    def on_finished(self, output) -> None:
        """One engine request finished (`output.timing` set by the loop)."""
        if output.error is not None:
            return
        timing = output.timing
        self.te_request_input_length.observe(output.num_tokens)
        self.vllm_request_success.inc()
        self.vllm_request_prompt_tokens.observe(output.num_tokens)
        self.vllm_e2e.observe(timing.finished - timing.submitted)
        self.vllm_queue.observe(timing.queue_seconds)
        self.vllm_inference.observe(timing.inference_seconds)

    # ---- scrape time ------------------------------------------------------------------------
    def observe_queue(self, waiting: int, running: int) -> None:
        self.te_queue_size.set(waiting)
        self.vllm_waiting.set(waiting)
        self.vllm_running.set(running)

    # ---- one HTTP (or gRPC) request, at its end ---------------------------------------------
    def on_request(self, status: int, seconds: float, call, num_items: int | None) -> None:
        """Count an inference request. `call` is its engine CallContext (None when it was
        refused before reaching the engine); `num_items` its number of inputs when known."""
        method = "batch" if (num_items or 1) > 1 else "single"
        self.te_request_count.labels(method).inc()
        if call is not None:
            for task, n in call.submitted.items():
                if task in _EMBED_TASKS:
                    self.te_embed_count.inc(n)
                elif task in _PREDICT_TASKS:
                    self.te_predict_count.inc(n)
            for output in call.finished:
                if output.error is not None:
                    continue
                task = output.extra.get("task")
                if task in _EMBED_TASKS:
                    self.te_embed_success.inc()
                elif task in _PREDICT_TASKS:
                    self.te_predict_success.inc()
        if status >= 400:
            self.te_request_failure.labels(failure_kind(status)).inc()
            return
        self.te_request_success.labels(method).inc()
        self.te_request_duration.observe(seconds)
        if call is None:
            return
        self.te_request_tokenization_duration.observe(call.tokenize_seconds)
        timed = [o.timing for o in call.finished if o.timing is not None]
        if timed:
            self.te_request_queue_duration.observe(
                sum(t.queue_seconds for t in timed) / len(timed))
            self.te_request_inference_duration.observe(
                sum(t.inference_seconds for t in timed) / len(timed))


class _One:
    """A collector of one metric family, for generate_latest."""

    def __init__(self, metric):
        self.metric = metric

    def collect(self):
        return [self.metric]


def render_text(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format, TEI's counters without `_total` (and without
    the `_created` series prometheus_client adds), every other family as prometheus_client
    writes it."""
    parts = []
    for metric in registry.collect():
        if metric.type == "counter" and metric.name in TEI_COUNTERS:
            lines = [f"# HELP {metric.name} {metric.documentation}",
                     f"# TYPE {metric.name} counter"]
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                lines.append(f"{metric.name}{{{labels}}} {floatToGoString(sample.value)}"
                             if labels else f"{metric.name} {floatToGoString(sample.value)}")
            parts.append(("\n".join(lines) + "\n").encode())
        else:
            parts.append(generate_latest(_One(metric)))
    return b"".join(parts)
