"""GPU check: pooler's CUDA path against the CPU engine and sentence-transformers on the same
seeded weights, and embed speed against sentence-transformers on the same GPU.

    python benchmarks/gpu_check.py --folders .gpu --out OUT [--device cuda]

`--folders` holds model folders without weights (configs, tokenizers, sentence-transformers
module files; `prepare` below makes them from the bench's folders); each gets seeded random
weights of its architecture, saved by transformers, where the weights are missing (a CUDA
machine here reaches no hub and takes at most 64 MiB of files). Every check prints one line and
goes into OUT/gpu_check.json; a check that raises is recorded with its error and the rest run.

Checks, per dtype (float32, bfloat16, float16):
- tiny ModernBERT (local attention), Llama (causal) and Qwen3 (causal, GQA) folders: embed of
  mixed-length token ids vs pooler's CPU engine in fp32 (the attention variants of varlen);
- embed (mean pooling + normalize, MiniLM shape): vs sentence-transformers fp32 on CPU, over
  200 mixed texts (short queries and passages, some truncated) in one call, and one text alone
  vs in the batch;
- token_embed, ColBERT rerank, NER, cross-encoder scores: vs pooler's CPU engine in fp32 (the
  CPU engine is held to transformers / sentence-transformers / PyLate by the test suite);
- speed: the 2,000-text embed corpus, pooler vs sentence-transformers `encode` (batch 32 and its
  best of 32-512) in the same dtype on the same GPU, and one short query at a time (p50).
With `--device cpu` the same script runs here (a smoke test of the script itself).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import transformers

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pooler import Engine  # noqa: E402
from pooler.bench import corpus  # noqa: E402
from pooler.bench.common import one_at_a_time  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


# ---- folders ------------------------------------------------------------------------------
def prepare(dest: Path) -> None:
    """Copy the bench's model folders into dest without their backbone weights (run here)."""
    from pooler.bench.common import minilm_path, shared_model
    from pooler.bench.workloads import colbert, cross_encoder

    sources = {"minilm": minilm_path(), "colbert": colbert.model_path(),
               "cross_encoder": cross_encoder.model_path(),
               "ner": shared_model("ner-pii-minilm")}
    for name, src in sources.items():
        if src is None:
            continue
        out = dest / name
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out, ignore=lambda d, files: [
            f for f in files if (f in _WEIGHT_FILES and Path(d) == Path(src))
            or f in ("README.md", "data_config.json", ".gitattributes")])
        print(f"prepared {out}")
    # Tiny seeded models for the CUDA attention variants (weights small enough to carry):
    # ModernBERT local attention (varlen window), decoders causal with and without GQA.
    from tests.models.modernbert_folders import build_modernbert
    from tests.models.tiny_task_models import save_decoder_model

    tiny = dest / "tiny"
    shutil.rmtree(tiny, ignore_errors=True)
    build_modernbert(tiny / "modernbert_local")
    save_decoder_model(tiny / "qwen3_gqa", "qwen3", "base")
    save_decoder_model(tiny / "llama_causal", "llama", "base", num_key_value_heads=4)
    print(f"prepared {tiny}")


def ensure_weights(folder: Path) -> None:
    """Seeded random weights of the folder's architecture, saved by transformers."""
    if any((folder / f).is_file() for f in _WEIGHT_FILES):
        return
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    arch = (config.architectures or ["BertModel"])[0]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config)
    model.save_pretrained(folder)


# ---- helpers ------------------------------------------------------------------------------
def _cos_min(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return float((a * b).sum(-1).min())


def _entities(out) -> list[set]:
    return [{(e.entity_group, e.start, e.end) for e in ents} for ents in out]


def _f1(a: list[set], b: list[set]) -> float:
    common = sum(len(x & y) for x, y in zip(a, b))
    total = sum(len(x) + len(y) for x, y in zip(a, b))
    return 1.0 if total == 0 else 2 * common / total


def _rate(call, items: int) -> float:
    """items per second of one timed call."""
    start = time.perf_counter()
    call()
    return items / (time.perf_counter() - start)


def _p50_ms(call, inputs) -> float:
    """Median latency of call(x) over inputs, one at a time."""
    return statistics.median(one_at_a_time(call, inputs)[0])


class Report:
    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def check(self, name: str, fn) -> None:
        start = time.perf_counter()
        try:
            row = {"check": name, **fn()}
        except Exception as exc:  # record and go on: one broken path must not hide the rest
            row = {"check": name, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}
        row["seconds"] = round(time.perf_counter() - start, 2)
        self.rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.rows, indent=1))


# ---- checks -------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folders", default=".gpu")
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prepare", action="store_true", help="make --folders from the bench's")
    ap.add_argument("--quick", action="store_true", help="small inputs (smoke test)")
    args = ap.parse_args()
    folders, out, device = Path(args.folders), Path(args.out), args.device
    if args.prepare:
        prepare(folders)
        return
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    n_small, n_corpus = (24, 64) if args.quick else (200, 2000)

    def env():
        info = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        from pooler.layers import attention
        info["varlen_attn"] = sorted(attention._VARLEN_PARAMS) if attention._varlen_attn else None
        import sentence_transformers
        import transformers
        info["transformers"] = transformers.__version__
        info["sentence_transformers"] = sentence_transformers.__version__
        return info
    report.check("environment", env)

    present = {}
    for name in ("minilm", "colbert", "cross_encoder", "ner"):
        folder = folders / name
        if (folder / "config.json").is_file():
            report.check(f"weights {name}", lambda f=folder: (ensure_weights(f), {})[1])
            present[name] = folder

    texts = corpus.mixed_corpus(n_small, seed=5)
    if "minilm" in present:
        folder = present["minilm"]
        ref = {}

        def st_reference():
            from sentence_transformers import SentenceTransformer
            st = SentenceTransformer(str(folder), device="cpu")
            ref["emb"] = st.encode(texts, batch_size=32)
            return {"texts": len(texts)}
        report.check("st cpu fp32 reference", st_reference)

        def cpu_tokens():
            ref["tokens"] = [o.embeddings for o in
                             Engine(str(folder), device="cpu").token_embed(texts[:32])]
            return {}
        report.check("token_embed cpu fp32 reference", cpu_tokens)
        for dtype in DTYPES:
            def embed_parity(dtype=dtype):
                engine = Engine(str(folder), device=device, dtype=dtype)
                got = np.stack([o.embedding for o in engine.embed(texts)]).astype(np.float32)
                alone = np.asarray(engine.embed(texts[7])[0].embedding, dtype=np.float32)
                tokens = [np.asarray(o.embeddings, dtype=np.float32)
                          for o in engine.token_embed(texts[:32])]
                return {"max_abs_vs_st": float(np.abs(got - ref["emb"]).max()),
                        "cos_min_vs_st": _cos_min(got, ref["emb"]),
                        "alone_vs_batch_max_abs": float(np.abs(alone - got[7]).max()),
                        "token_embed_max_abs_vs_cpu": max(
                            float(np.abs(t - np.asarray(c)).max())
                            for t, c in zip(tokens, ref["tokens"]))}
            report.check(f"embed+token_embed {device} {dtype}", embed_parity)

    if "colbert" in present:
        folder = present["colbert"]
        query = corpus.queries(1, seed=21)[0]
        docs = corpus.passages(40, seed=300)
        cpu_scores = np.array([r.score for r in sorted(
            Engine(str(folder), device="cpu").rerank(query, docs), key=lambda r: r.index)])
        for dtype in DTYPES:
            def colbert_check(dtype=dtype, cpu_scores=cpu_scores):
                engine = Engine(str(folder), device=device, dtype=dtype)
                got = np.array([r.score for r in sorted(engine.rerank(query, docs),
                                                        key=lambda r: r.index)])
                top = lambda s: set(np.argsort(-s)[:10].tolist())  # noqa: E731
                return {"max_rel_vs_cpu": float(np.abs(got - cpu_scores).max()
                                                / np.abs(cpu_scores).max()),
                        "top10_overlap": len(top(got) & top(cpu_scores)) / 10}
            report.check(f"colbert rerank {device} {dtype}", colbert_check)

    if "ner" in present:
        folder = present["ner"]
        from pooler.bench.workloads.ner import pii_texts
        ner_texts = pii_texts(n_small)
        cpu_ents = _entities(Engine(str(folder), device="cpu").ner(ner_texts))
        for dtype in DTYPES:
            def ner_check(dtype=dtype):
                got = _entities(Engine(str(folder), device=device, dtype=dtype).ner(ner_texts))
                return {"entity_f1_vs_cpu": _f1(got, cpu_ents),
                        "entities": sum(len(x) for x in got)}
            report.check(f"ner {device} {dtype}", ner_check)

    if "cross_encoder" in present:
        folder = present["cross_encoder"]
        query = corpus.queries(1, seed=31)[0]
        docs = corpus.passages(40, seed=32)
        cpu_scores = np.array([o.score for o in Engine(str(folder), device="cpu")
                               .score(query, docs)])
        for dtype in DTYPES:
            def ce_check(dtype=dtype, cpu_scores=cpu_scores):
                got = np.array([o.score for o in Engine(str(folder), device=device, dtype=dtype)
                                .score(query, docs)])
                return {"max_abs_vs_cpu": float(np.abs(got - cpu_scores).max())}
            report.check(f"cross_encoder {device} {dtype}", ce_check)

    for folder in sorted((folders / "tiny").glob("*")):
        import json as _json
        vocab = _json.loads((folder / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        ids = [rng.integers(5, vocab, n).tolist() for n in (5, 9, 1, 9, 13, 2, 40, 60, 60)]
        ref_tiny = np.stack([o.embedding for o in Engine(str(folder), device="cpu")
                             .embed(ids, normalize=False)])
        for dtype in DTYPES:
            def tiny_check(folder=folder, dtype=dtype, ref_tiny=ref_tiny, ids=ids):
                engine = Engine(str(folder), device=device, dtype=dtype)
                got = np.stack([o.embedding for o in engine.embed(ids, normalize=False)]
                               ).astype(np.float32)
                return {"max_abs_vs_cpu": float(np.abs(got - ref_tiny).max()),
                        "cos_min_vs_cpu": _cos_min(got, ref_tiny)}
            report.check(f"tiny {folder.name} {device} {dtype}", tiny_check)

    if "minilm" in present:
        folder = present["minilm"]
        big = corpus.mixed_corpus(n_corpus)
        queries = corpus.queries(50 if args.quick else 200, seed=7)
        for dtype in DTYPES:
            def speed(dtype=dtype):
                from sentence_transformers import SentenceTransformer
                row = {}
                for budget in (2048, 16384):
                    engine = Engine(str(folder), device=device, dtype=dtype,
                                    max_num_batched_tokens=budget)
                    engine.embed(big[:64], use_tqdm=False)
                    row[f"pooler_budget{budget}_texts_s"] = _rate(
                        lambda: engine.embed(big, use_tqdm=False), len(big))
                row["pooler_single_p50_ms"] = _p50_ms(engine.embed, queries)
                del engine
                st = SentenceTransformer(str(folder), device=device,
                                         model_kwargs={"dtype": getattr(torch, dtype)})
                st.encode(big[:64], batch_size=32)
                for b in (32, 128, 512):
                    row[f"st_b{b}_texts_s"] = _rate(lambda: st.encode(big, batch_size=b),
                                                    len(big))
                row["st_single_p50_ms"] = _p50_ms(st.encode, queries)
                best_pooler = max(v for k, v in row.items() if k.startswith("pooler_budget"))
                row["ratio_vs_st_b32"] = best_pooler / row["st_b32_texts_s"]
                row["ratio_vs_st_best"] = best_pooler / max(
                    v for k, v in row.items() if k.startswith("st_b"))
                return {k: round(v, 3) for k, v in row.items()}
            report.check(f"embed speed {device} {dtype} ({len(big)} texts)", speed)


if __name__ == "__main__":
    main()
