"""Architecture workload: real-size random-weight MPNet, DeBERTa-v3 and Gemma3 (and, on
request, BERT and the rotary encoders NomicBert, GTE, Jina v3 and EuroBERT, which need
transformers >= 5.24) run by pooler's native runner, by pooler's transformers fallback runner (padded
batches through the transformers model), and by the library users run them with
(sentence-transformers `encode` for the embedders, `CrossEncoder.predict` for the DeBERTa-v3
reranker), tokens/s side by side on the same texts.

An architecture pooler does not run natively yet shows its native row as SKIPPED ("not native
yet"); the other two rows still run. Folders: pooler/bench/arch_folders.py. Pick architectures
with `--archs` (default mpnet,deberta-v3,gemma3); `--corpus-size` sets the texts per side
(default 200; --quick: 16 texts on tiny configs).
"""
from __future__ import annotations

import time

import numpy as np

from pooler.bench import corpus
from pooler.bench.arch_folders import ARCH_MODELS, DEFAULT_ARCHS, arch_folder
from pooler.bench.common import pooler_engine, save_array, token_lens
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

DEFAULT_TEXTS = 200


def selected_archs(opts: BenchOptions) -> list[str]:
    names = opts.extra.get("archs") or list(DEFAULT_ARCHS)
    unknown = [n for n in names if n not in ARCH_MODELS]
    if unknown:
        raise ValueError(f"--archs: unknown {unknown}; choose from {sorted(ARCH_MODELS)}.")
    return names


def native_skip_reason(arch: str) -> str | None:
    """Why pooler cannot run `arch` natively (its family is not registered), or None."""
    from pooler.architectures import NATIVE_ARCHITECTURES

    architecture = ARCH_MODELS[arch].architecture
    if architecture in NATIVE_ARCHITECTURES:
        return None
    return f"not native yet ({architecture}): the fallback row runs it through transformers"


def _inputs(opts: BenchOptions, kind: str) -> tuple[list[str], list[str] | None]:
    """(texts, pairs): a mixed corpus to embed, or (query, passage) pairs to score."""
    n = 16 if opts.quick else int(opts.extra.get("corpus_size") or DEFAULT_TEXTS)
    if kind == "embed":
        return corpus.mixed_corpus(n, seed=11), None
    return corpus.queries(n, seed=12), corpus.passages(n, seed=13)


def _result(arch: str, side: str, role: str, opts: BenchOptions, texts, pairs, seconds: float,
            loaded: float, outputs: np.ndarray) -> SideResult:
    path = arch_folder(arch, opts.quick)
    # Scores compare as one vector per side ([1, n]); embeddings row by row.
    outputs = outputs[None, :] if outputs.ndim == 1 else outputs
    return SideResult(side, role, len(texts), sum(token_lens(path, texts, pairs)), seconds,
                      loaded_rss_mb=loaded,
                      outputs_file=save_array(opts, f"arch-{side}".replace(" ", "_"), outputs))


def _pooler(arch: str, runner: str, side: str):
    def run(opts: BenchOptions) -> SideResult:
        kind = ARCH_MODELS[arch].kind
        texts, pairs = _inputs(opts, kind)
        engine = pooler_engine(arch_folder(arch, opts.quick), opts, runner=runner)

        def call(xs, ps):
            if kind == "embed":
                return np.stack([o.embedding for o in engine.embed(xs, use_tqdm=False)])
            return np.array([o.score for o in engine.score(xs, ps, use_tqdm=False)],
                            dtype=np.float32)

        call(texts[:8], pairs[:8] if pairs else None)  # warm up kernels and allocator
        loaded = rss_mb()
        start = time.perf_counter()
        outputs = call(texts, pairs)
        seconds = time.perf_counter() - start
        return _result(arch, side, "pooler", opts, texts, pairs, seconds, loaded, outputs)
    return run


def _peer(arch: str, side: str):
    def run(opts: BenchOptions) -> SideResult:
        kind = ARCH_MODELS[arch].kind
        texts, pairs = _inputs(opts, kind)
        path = str(arch_folder(arch, opts.quick))
        device = "cuda" if opts.device == "cuda" else "cpu"
        kwargs = {} if opts.dtype == "float32" else {"model_kwargs": {"dtype": opts.dtype}}
        if kind == "embed":
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(path, device=device, **kwargs)

            def call(xs, ps):
                return model.encode(xs, batch_size=32, convert_to_numpy=True)
        else:
            from sentence_transformers import CrossEncoder

            model = CrossEncoder(path, device=device, **kwargs)

            def call(xs, ps):
                return np.asarray(model.predict(list(zip(xs, ps)), batch_size=32),
                                  dtype=np.float32)

        call(texts[:8], pairs[:8] if pairs else None)  # warm up
        loaded = rss_mb()
        start = time.perf_counter()
        outputs = call(texts, pairs)
        seconds = time.perf_counter() - start
        return _result(arch, side, "peer", opts, texts, pairs, seconds, loaded, outputs)
    return run


def peer_name(arch: str) -> str:
    return f"{arch} " + ("st b32" if ARCH_MODELS[arch].kind == "embed" else "CrossEncoder b32")


def _sides(opts: BenchOptions) -> list[Side]:
    sides = []
    for arch in selected_archs(opts):
        sides += [
            Side(f"{arch} pooler", "pooler", _pooler(arch, "native", f"{arch} pooler"),
                 skip=native_skip_reason(arch)),
            Side(f"{arch} fallback", "pooler",
                 _pooler(arch, "transformers", f"{arch} fallback")),
            Side(peer_name(arch), "peer", _peer(arch, peer_name(arch))),
        ]
    return sides


register(Workload(
    name="arch",
    description="real-size random-weight MPNet / DeBERTa-v3 reranker / Gemma3 (EmbeddingGemma "
                "shape): pooler native vs pooler's transformers fallback vs sentence-transformers",
    metric="throughput", sides=_sides, baseline="",
    # every side of an architecture is compared with that architecture's peer
    baselines={f"{arch} {what}": peer_name(arch) for arch in ARCH_MODELS
               for what in ("pooler", "fallback")}))
