"""Lever measurements behind docs/dev/journal.md (single process, not side by side).

On a shared machine wall time is noise, so these default to ONE thread and report the CPU time
of the measuring thread (time.thread_time): it counts the work done, not the waiting. Usage:

    python benchmarks/levers.py engine --texts 400 [--kw '{"max_num_batched_tokens": 2048}']
    python benchmarks/levers.py st --texts 400                # sentence-transformers b32 and b8
    python benchmarks/levers.py single                        # where a one-query call spends
    python benchmarks/levers.py attention                     # packed attention variants
    python benchmarks/levers.py attention-ab --threads 2      # matmul path on/off, whole jobs
    python benchmarks/levers.py linear --rows 12              # 24 MiniLM-shaped linears
    python benchmarks/levers.py int8-accuracy --texts 2000    # min/mean cosine per fp32 set
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from pooler.bench.corpus import mixed_corpus, queries

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _clock(threads: int):
    return time.thread_time if threads == 1 else time.perf_counter


def _tokens(engine, texts):
    return sum(len(e.input_ids) for e in engine.tokenizer.encode_batch(
        texts, max_length=engine.model_config.max_model_len))


def engine_throughput(args):
    from pooler import Engine
    texts = mixed_corpus(2000)[:args.texts]
    engine = Engine(MODEL, num_threads=args.threads, device="cpu", **json.loads(args.kw))
    tokens = _tokens(engine, texts)
    engine.embed(texts[:20])
    clock = _clock(args.threads)
    start = clock()
    engine.embed(texts, use_tqdm=False)
    seconds = clock() - start
    print(f"pooler {args.kw}: {tokens / seconds:.0f} tokens/s ({tokens} tokens)")


def st_throughput(args):
    from sentence_transformers import SentenceTransformer

    from pooler.model_folder import resolve_model_path
    texts = mixed_corpus(2000)[:args.texts]
    model = SentenceTransformer(str(resolve_model_path(MODEL)), device="cpu")
    tokens = sum(len(x) for x in model.tokenizer(texts, truncation=True,
                                                  max_length=model.max_seq_length)["input_ids"])
    model.encode(texts[:32])
    clock = _clock(args.threads)
    for batch_size in (32, 8):
        start = clock()
        model.encode(texts, batch_size=batch_size)
        print(f"sentence-transformers b{batch_size}: {tokens / (clock() - start):.0f} tokens/s")


def single_query(args):
    from pooler import Engine
    from pooler.step_contract import NewRequestData
    from pooler.params import PoolingParams
    texts = queries(200, seed=7)
    engine = Engine(MODEL, num_threads=args.threads, device="cpu", **json.loads(args.kw))
    runner = engine.core.model_runner
    clock = _clock(args.threads)

    def per_call_ms(fn):
        for t in texts[:10]:
            fn(t)
        start = clock()
        for t in texts:
            fn(t)
        return (clock() - start) / len(texts) * 1e3
    params = engine.verify_params(PoolingParams(task="embed"))
    reqs = {t: [NewRequestData("x", engine.processor.process([t])[0].prompt_token_ids, None,
                               None, 0, params)] for t in texts}
    prepared = {t: runner._prepare_inputs(reqs[t]) for t in texts}

    def forward(t):
        with torch.inference_mode():
            return runner.model.backbone(prepared[t][0])
    hidden = {t: forward(t) for t in texts}

    def pool(t):
        with torch.inference_mode():
            return runner.pooling_runner.pool(hidden[t], prepared[t][1], [True])
    print(f"engine.embed(one query): {per_call_ms(lambda t: engine.embed(t)):.2f} ms")
    print(f"  tokenize: {per_call_ms(lambda t: engine.processor.process([t])):.3f} ms")
    print(f"  prepare inputs: {per_call_ms(lambda t: runner._prepare_inputs(reqs[t])):.3f} ms")
    print(f"  forward: {per_call_ms(forward):.2f} ms")
    print(f"  pool: {per_call_ms(pool):.3f} ms")
    if args.peer:
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(str(engine.model_config.path), device="cpu")
        print(f"sentence-transformers encode(one query): "
              f"{per_call_ms(lambda t: st.encode(t)):.2f} ms")


def attention(args):
    """Packed attention over one 8k-token step of the corpus: current kernel vs alternatives."""
    from tokenizers import Tokenizer

    from pooler.layers.attention import packed_attention
    from pooler.model_folder import resolve_model_path
    tok = Tokenizer.from_file(str(resolve_model_path(MODEL) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    lens = [len(e.ids) for e in tok.encode_batch(mixed_corpus(2000))]
    heads, dim = 12, 32

    def take(ls, budget=8192):
        out, total = [], 0
        for n in ls:
            if total + n > budget:
                break
            out.append(n)
            total += n
        return out

    def padded(qkv, seq_lens, group=16):  # pad groups of 16 to their longest, key mask
        starts = np.concatenate([[0], np.cumsum(seq_lens)])
        out = torch.empty(qkv.shape[0], heads * dim)
        for g in range(0, len(seq_lens), group):
            ls = seq_lens[g:g + group]
            m, b = max(ls), len(ls)
            buf = torch.zeros(b, m, 3 * heads * dim)
            mask = torch.zeros(b, 1, 1, m, dtype=torch.bool)
            for i, n in enumerate(ls):
                buf[i, :n] = qkv[starts[g + i]:starts[g + i] + n]
                mask[i, ..., :n] = True
            x = buf.view(b, m, 3, heads, dim).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=mask)
            o = o.transpose(1, 2).reshape(b, m, -1)
            for i, n in enumerate(ls):
                out[starts[g + i]:starts[g + i] + n] = o[i, :n]
        return out

    def math(qkv, seq_lens):  # explicit bmm + softmax per sequence
        out, s = torch.empty(qkv.shape[0], heads * dim), 0
        for n in seq_lens:
            x = qkv[s:s + n].view(n, 3, heads, dim).permute(1, 2, 0, 3).contiguous()
            a = torch.bmm(x[0], x[1].transpose(1, 2)).mul_(dim ** -0.5).softmax(-1)
            out[s:s + n] = torch.bmm(a, x[2]).transpose(0, 1).reshape(n, -1)
            s += n
        return out

    clock = _clock(args.threads)
    for name, seq_lens in [("arrival order", take(lens)), ("length-sorted", take(sorted(lens)))]:
        qkv = torch.randn(sum(seq_lens), 3 * heads * dim)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(seq_lens)]), dtype=torch.int32)
        variants = {
            "packed_attention (SDPA per run of equal lengths)": lambda: packed_attention(
                *qkv.view(-1, 3, heads, dim).unbind(1), seq_lens, cu, max(seq_lens)),
            "padded groups of 16 + mask": lambda: padded(qkv, seq_lens),
            "bmm + softmax per sequence": lambda: math(qkv, seq_lens),
        }
        print(f"{name}: {len(seq_lens)} sequences, {sum(seq_lens)} tokens")
        for label, fn in variants.items():
            fn()
            start = clock()
            for _ in range(3):
                fn()
            print(f"  {label}: {(clock() - start) / 3 * 1e3:.1f} ms")


def linear(args):
    """24 MiniLM-shaped linears (weights cold in cache, like a real forward)."""
    rows = args.rows
    layers = []
    for _ in range(6):
        for k, n in [(384, 1152), (384, 384), (384, 1536), (1536, 384)]:
            w, b = torch.randn(n, k), torch.randn(n)
            layers.append((w, b, torch.ops.mkldnn._reorder_linear_weight(w), w.bfloat16()))
    xs = {384: torch.randn(rows, 384), 1536: torch.randn(rows, 1536)}

    def run(kind):
        for w, b, packed, wb in layers:
            x = xs[w.shape[1]]
            if kind == "F.linear (MKL)":
                F.linear(x, w, b)
            elif kind == "oneDNN":
                torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
            elif kind == "oneDNN prepacked":
                torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
            elif kind == "bf16 (not default)":
                F.linear(x.bfloat16(), wb).float()
    clock = _clock(args.threads)
    for kind in ("F.linear (MKL)", "oneDNN", "oneDNN prepacked", "bf16 (not default)"):
        run(kind)
        repeats = 20 if rows < 100 else 3
        start = clock()
        for _ in range(repeats):
            run(kind)
        print(f"{kind}: {(clock() - start) / repeats * 1e3:.2f} ms for {rows} rows")


def int8_accuracy(args):
    from pooler import Engine
    from pooler.layers.quantization import quantize_linears
    texts = mixed_corpus(2000)[:args.texts]
    engine = Engine(MODEL, num_threads=args.threads, device="cpu")
    ref = np.stack([o.embedding for o in engine.embed(texts, use_tqdm=False)])
    original = copy.deepcopy(engine.core.model_runner.model.backbone)
    for keep in [(), ("qkv_proj",), ("down_proj",)]:
        engine.core.model_runner.model.backbone = copy.deepcopy(original)
        quantize_linears(engine.core.model_runner.model.backbone, keep)
        out = np.stack([o.embedding for o in engine.embed(texts, use_tqdm=False)])
        cos = (out * ref).sum(axis=1)
        print(f"fp32 kept: {keep or 'none'}: min cosine {cos.min():.5f}, "
              f"mean {cos.mean():.5f}")


def attention_ab(args):
    """Whole jobs with the CPU matmul attention path off (_MATH_MAX_LEN 0: SDPA for every
    length) and on (192), alternating in one process, 3 rounds each: embed on the corpus, NER
    on the bench's PII texts, ColBERT rerank 1 x 100 (the last two need ../shared and the bench's
    cached ColBERT folder)."""
    from pooler import Engine
    from pooler.bench.common import shared_model
    from pooler.layers import attention as att

    texts = mixed_corpus(2000)[:args.texts]
    jobs = {"embed": (lambda e=Engine(MODEL, num_threads=args.threads, device="cpu"):
                      e.embed(texts, use_tqdm=False))}
    ner_model = shared_model("ner-pii-minilm")
    if ner_model is not None:
        from pooler.bench.workloads.ner import pii_texts
        ner_texts = pii_texts(500)
        ner_engine = Engine(str(ner_model), num_threads=args.threads, device="cpu")
        jobs["ner"] = lambda: ner_engine.ner(ner_texts, use_tqdm=False)
    from pooler.bench.registry import BenchOptions
    from pooler.bench.workloads import colbert
    query, docs = colbert._inputs(BenchOptions(model=MODEL, threads=args.threads), "1x100")
    colbert_engine = Engine(str(colbert.model_path()), num_threads=args.threads, device="cpu")
    jobs["colbert 1x100"] = lambda: colbert_engine.rerank(query[0], docs[0], use_tqdm=False)
    clock = _clock(args.threads)
    for name, job in jobs.items():
        job()  # warm up
        seconds = {0: [], 192: []}
        for _ in range(3):
            for limit in seconds:
                att._MATH_MAX_LEN = limit
                start = clock()
                job()
                seconds[limit].append(clock() - start)
        print(f"{name}: SDPA everywhere {min(seconds[0]):.3f} s, matmul <= 192 tokens "
              f"{min(seconds[192]):.3f} s (ratio {min(seconds[192]) / min(seconds[0]):.3f})")
    att._MATH_MAX_LEN = 192


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lever", choices=["engine", "st", "single", "attention", "attention-ab",
                                          "linear", "int8-accuracy"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--kw", default="{}", help="Engine keyword arguments as JSON")
    parser.add_argument("--peer", action="store_true", help="single: time s-t too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"engine": engine_throughput, "st": st_throughput, "single": single_query,
     "attention": attention, "attention-ab": attention_ab, "linear": linear, "int8-accuracy": int8_accuracy}[args.lever](args)


if __name__ == "__main__":
    main()
