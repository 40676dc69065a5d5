"""Long-context workload: one model forward over whole documents of 1,024 to 8,192 tokens (no
chunking; the `long_documents` workload is about documents longer than the model), on
real-size random-weight long-context encoders (pooler/bench/long_folders.py: ModernBERT-base,
NomicBert, GTE and BGE-M3 by default; Jina v3 on request), pooler vs sentence-transformers
`encode` at its best batch size (1 or 2 documents per batch, 4 too where there are 4
documents; the note says which won) and ONNX Runtime fp32 on the model exported by torch.onnx
(1 document per run: its eager attention holds L x L scores per head). An architecture that
does not export prints SKIPPED with the exporter's error.

Each (architecture, length, library) is its own process, so peak RSS (VmHWM, model load
included) is that side's; each side is warmed up on one more document of the timed length
before the timed call. Documents are words that are one token each in the shared WordPiece
vocabulary, so each has exactly L tokens on every side ([CLS] and [SEP] included). `--lengths`
picks the lengths (default 1024,2048,4096,8192; --quick: 128 on tiny configs), `--archs` the
models, `--corpus-size` the documents per length (default max(2, 4096 / L)).

Share of the ceiling: the model FLOPs the documents need over the seconds they took, as a share
of the fastest fp32 GEMM rate the invocation measured (pooler/bench/machine.py: before the runs,
after them, and in each side's process right after its timed part; the host's speed drifts, so a
slowed measurement must not inflate a share). The FLOPs of one document of
L tokens, counted the same for every side:
- linear layers: 2 x (weights of every nn.Linear of the encoder, the pooler head excluded)
  per token; embeddings, norms, biases, activations, softmax and rotary are not counted;
- attention, per layer: 4 x d x K per query token (2 d K for Q K^T and 2 d K for the weighted
  sum of V; d = heads x head size), where K is the number of keys it attends to: L in a
  global layer; in a local layer (ModernBERT's sliding_attention, window w = local_attention,
  half window h = w / 2) the keys j with |i - j| <= h inside the document, i.e.
  min(i + h, L - 1) - max(i - h, 0) + 1 for query i (2 h + 1 = 129 away from the ends).
- a model whose sentence-transformers Pooling reads one token (`cls`, `lasttoken`: GTE and
  BGE-M3 here) needs its last layer's output on that token alone: that layer counts its key and
  value projections for every token, the rest of its linears for one token, and the attention
  of that one query. (pooler computes exactly that: docs/performance/cpu.md, "The last layer on
  the pooled rows"; sentence-transformers computes the whole layer, so its share is of the
  same, smaller count.)
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from pooler.bench.common import pooler_engine, save_array, token_lens
from pooler.bench.long_folders import DEFAULT_LONG_ARCHS, LONG_MODELS, long_folder
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

LENGTHS = (1024, 2048, 4096, 8192)
QUICK_LENGTHS = (128,)
_ST_BATCHES = (1, 2, 4)
FLOP_RULE = ("model FLOPs per document of L tokens: 2 x linear weights (encoder nn.Linear, "
             "pooler head excluded) per token + per layer 4 x hidden x keys per token (keys: "
             "L in global layers; ModernBERT local layers: |i - j| <= local_attention / 2 "
             "inside the document); one-token pooling (CLS, last token): the last layer's K/V for every "
             "token, the rest of it for that token; % ceiling = those FLOPs / seconds / the fastest fp32 GEMM rate "
             "measured in the run")


def selected_archs(opts: BenchOptions) -> list[str]:
    names = opts.extra.get("archs") or list(DEFAULT_LONG_ARCHS)
    unknown = [n for n in names if n not in LONG_MODELS]
    if unknown:
        raise ValueError(f"--archs: unknown {unknown} for long_context; choose from "
                         f"{sorted(LONG_MODELS)}.")
    return names


def selected_lengths(opts: BenchOptions) -> list[int]:
    lengths = opts.extra.get("lengths") or (QUICK_LENGTHS if opts.quick else LENGTHS)
    bad = [n for n in lengths if not 16 <= int(n) <= 8192]
    if bad:
        raise ValueError(f"--lengths: {bad} out of range; give token counts from 16 to 8192.")
    return [int(n) for n in lengths]


def documents_per_length(opts: BenchOptions, length: int) -> int:
    return int(opts.extra.get("corpus_size") or max(2, 4096 // length))


# ---- documents ----------------------------------------------------------------------------
def _single_token_words(folder: Path) -> list[str]:
    """Lower-case ASCII words that are one whole token of the folder's WordPiece vocabulary."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()  # token -> id
    return sorted(w for w, i in vocab.items() if i >= 1000 and len(w) >= 3 and w.isascii()
                  and w.isalpha() and w.islower())


def documents(folder: Path, length: int, count: int, seed: int = 0) -> list[str]:
    """`count` seeded documents of exactly `length` tokens ([CLS] + length - 2 words + [SEP])
    under the folder's tokenizer; raises if the tokenizer disagrees."""
    words = _single_token_words(folder)
    rng = np.random.default_rng(seed + length)
    docs = [" ".join(words[i] for i in rng.integers(0, len(words), length - 2))
            for _ in range(count)]
    got = token_lens(folder, docs)
    if got != [length] * count:
        raise RuntimeError(f"{folder}: documents meant to be {length} tokens are {got}.")
    return docs


# ---- FLOPs --------------------------------------------------------------------------------
def linear_weights(config) -> int:
    """Weights of the encoder's nn.Linear layers (the pooler head, run once per document if at
    all, excluded), counted on the meta device (no memory)."""
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, config.architectures[0])(config)
    return sum(m.weight.numel() for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "pooler" not in name.split("."))


def attention_keys(length: int, half_window: int | None) -> int:
    """Keys summed over the document's queries: L x L for a global layer; for a local one the
    keys j with |i - j| <= half_window inside the document."""
    if half_window is None:
        return length * length
    i = np.arange(length)
    return int((np.minimum(i + half_window, length - 1) - np.maximum(i - half_window, 0)
                + 1).sum())


def document_flops(folder: Path, length: int) -> float:
    """Model FLOPs of one document of `length` tokens (the rule in this module's docstring)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(folder))
    hidden = int(config.hidden_size)
    layer_types = getattr(config, "layer_types", None) or \
        ["full_attention"] * int(config.num_hidden_layers)
    half = None  # ModernBERT's sliding_window is local_attention // 2
    if "sliding_attention" in layer_types:
        half = int(getattr(config, "sliding_window", None) or int(config.local_attention) // 2)
    halves = [half if kind == "sliding_attention" else None for kind in layer_types]
    linears = linear_weights(config)
    if not pools_one_token(folder):
        return float(2 * linears * length + sum(4 * hidden * attention_keys(length, h)
                                                for h in halves))
    # the last layer on the pooled token: K/V projections for every token, the rest of the
    # layer's linears and one query's attention for that token (the layers are alike)
    per_layer = linears // len(layer_types)
    heads = int(config.num_attention_heads)
    kv_dim = int(getattr(config, "num_key_value_heads", None) or heads) * (
        int(getattr(config, "head_dim", None) or hidden // heads))
    kv = 2 * hidden * kv_dim
    last_keys = length if halves[-1] is None else min(halves[-1], length - 1) + 1
    last = 2 * (kv * length + (per_layer - kv)) + 4 * hidden * last_keys
    return float(2 * (linears - per_layer) * length
                 + sum(4 * hidden * attention_keys(length, h) for h in halves[:-1]) + last)


def pools_one_token(folder: Path) -> bool:
    """Whether the folder's sentence-transformers Pooling module reads a single token."""
    pooling = Path(folder) / "1_Pooling" / "config.json"
    if not pooling.is_file():
        return False
    cfg = json.loads(pooling.read_text())
    mode = cfg.get("pooling_mode")
    if mode is not None:
        return mode in ("cls", "lasttoken")
    return bool(cfg.get("pooling_mode_cls_token") or cfg.get("pooling_mode_lasttoken"))


# ---- sides --------------------------------------------------------------------------------
def _vm_hwm_mb() -> float:
    """This process's peak RSS since exec (VmHWM; ru_maxrss can carry the parent's peak)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _result(arch: str, length: int, side: str, role: str, opts: BenchOptions, docs, seconds,
            loaded, outputs, note: str = "") -> SideResult:
    folder = long_folder(arch, opts.quick)
    return SideResult(side, role, len(docs), length * len(docs), seconds,
                      peak_rss_mb=_vm_hwm_mb(), loaded_rss_mb=loaded, note=note,
                      outputs_file=save_array(opts, f"long_context-{side}".replace(" ", "_"),
                                              outputs),
                      model_flops=document_flops(folder, length) * len(docs))


def _inputs(arch: str, length: int, opts: BenchOptions) -> tuple[Path, list[str], list[str]]:
    folder = long_folder(arch, opts.quick)
    docs = documents(folder, length, documents_per_length(opts, length))
    # Warm-up on a document of the timed length: pooler's first call at a new long length
    # paid ~9 s more than the next on GTE at 4k (scratch and pages touched once), a cost a
    # stream of documents pays once; every side gets the same warm-up.
    warmup = documents(folder, length, 1, seed=1)
    return folder, docs, warmup


def _pooler(arch: str, length: int, side: str):
    def run(opts: BenchOptions) -> SideResult:
        folder, docs, warmup = _inputs(arch, length, opts)
        engine = pooler_engine(folder, opts)
        engine.embed(warmup, use_tqdm=False)  # kernels and allocator
        loaded = rss_mb()
        start = time.perf_counter()
        outputs = engine.embed(docs, use_tqdm=False)
        seconds = time.perf_counter() - start
        emb = np.stack([o.embedding for o in outputs])  # [docs, hidden]
        return _result(arch, length, side, "pooler", opts, docs, seconds, loaded, emb)
    return run


def _sentence_transformers(arch: str, length: int, side: str):
    """encode at 1, 2 (and 4) documents per batch over all the documents; the fastest counts."""
    def run(opts: BenchOptions) -> SideResult:
        from sentence_transformers import SentenceTransformer

        folder, docs, warmup = _inputs(arch, length, opts)
        model = SentenceTransformer(str(folder), device="cpu")
        model.encode(warmup, batch_size=1)
        loaded = rss_mb()
        timings, outputs = {}, {}
        for batch in (b for b in _ST_BATCHES if b <= len(docs)):
            start = time.perf_counter()
            outputs[batch] = model.encode(docs, batch_size=batch, convert_to_numpy=True)
            timings[batch] = time.perf_counter() - start
        best = min(timings, key=timings.get)
        note = f"best batch {best} (" + ", ".join(
            f"b{b} {length * len(docs) / s:.0f} tok/s" for b, s in timings.items()) + ")"
        return _result(arch, length, side, "peer", opts, docs, timings[best], loaded,
                       outputs[best], note)
    return run


def _ort(arch: str, length: int, side: str):
    def run(opts: BenchOptions) -> SideResult:
        from pooler.bench.onnx_peer import FP32_FILE, OrtEmbedder

        folder, docs, warmup = _inputs(arch, length, opts)
        model = OrtEmbedder(folder, FP32_FILE, opts.threads, int8=False)
        model.encode(warmup, batch_size=1)
        loaded = rss_mb()
        start = time.perf_counter()
        emb = model.encode(docs, batch_size=1)
        seconds = time.perf_counter() - start
        return _result(arch, length, side, "peer", opts, docs, seconds, loaded, emb,
                       "batch 1, torch.onnx export (eager attention)")
    return run


def _ort_skip(arch: str, opts: BenchOptions) -> str | None:
    """Why the ORT side of `arch` cannot run: a missing package, or the export failing (tried
    once, in a child process, its reason kept beside the cache so later runs skip at once)."""
    from pooler.bench import onnx_peer
    from pooler.bench.common import cache_root

    if opts.device != "cpu":
        return "the ONNX Runtime peer runs on CPU only"
    reason = onnx_peer.skip_reason("onnxruntime", "onnx", "onnxscript")
    if reason:
        return reason
    marker = cache_root() / f"long-{arch}-{'tiny' if opts.quick else 'base'}-onnx-failed.json"
    if marker.is_file():
        return json.loads(marker.read_text())["reason"]
    try:
        onnx_peer.export_folder(long_folder(arch, opts.quick), int8=False)
    except RuntimeError as exc:
        reason = f"torch.onnx export failed: {exc}"
        marker.write_text(json.dumps({"reason": reason}))
        return reason
    return None


def _names(arch: str, length: int) -> dict[str, str]:
    return {k: f"{arch} {length} {k}" for k in ("pooler", "st", "ort fp32")}


def _sides(opts: BenchOptions) -> list[Side]:
    sides = []
    for arch in selected_archs(opts):
        ort_skip = _ort_skip(arch, opts)
        for length in selected_lengths(opts):
            names = _names(arch, length)
            # every side of (architecture, length) against that pair's sentence-transformers
            # side; the report lines compare pooler with the faster of the two peers
            WORKLOAD.baselines.update({names[k]: names["st"] for k in ("pooler", "ort fp32")})
            sides += [
                Side(names["pooler"], "pooler", _pooler(arch, length, names["pooler"])),
                Side(names["st"], "peer", _sentence_transformers(arch, length, names["st"])),
                Side(names["ort fp32"], "peer", _ort(arch, length, names["ort fp32"]),
                     skip=ort_skip),
            ]
    return sides


def _report_lines(rows) -> list[str]:
    """pooler against the faster peer of each (architecture, length), and the FLOPs counted."""
    lines = [f"long_context: {FLOP_RULE}"]
    by_side = {r.side: r for r in rows if not r.error}
    for row in rows:
        if row.error or not row.side.endswith(" pooler"):
            continue
        stem = row.side[:-len(" pooler")]
        peers = [by_side[s] for s in (f"{stem} st", f"{stem} ort fp32") if s in by_side]
        flops = row.model_flops / (row.tokens_per_s * row.seconds) if row.tokens_per_s \
            and row.seconds else 0.0
        line = f"long_context {stem}: {flops / 1e9:.3g} GFLOP per token counted"
        if peers:
            best = max(peers, key=lambda r: r.tokens_per_s)
            line += (f"; pooler {row.tokens_per_s:.0f} tok/s vs best peer "
                     f"{best.side[len(stem) + 1:]} {best.tokens_per_s:.0f} tok/s: "
                     f"{row.tokens_per_s / best.tokens_per_s:.2f}x; peak RSS "
                     f"{row.peak_rss_mb:.0f} vs {best.peak_rss_mb:.0f} MB")
        lines.append(line)
    return lines


WORKLOAD = register(Workload(
    name="long_context",
    description="whole 1k-8k-token documents in one forward on long-context encoders "
                "(ModernBERT-base, NomicBert, GTE, BGE-M3 shapes) vs sentence-transformers "
                "(best batch) and ONNX Runtime fp32; % of the FLOP ceiling",
    metric="throughput", sides=_sides, baseline="", report_lines=_report_lines))
