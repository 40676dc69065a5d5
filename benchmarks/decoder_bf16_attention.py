"""A decoder's long-document attention under a bf16 engine: as the model calls it today (fp32
q/k/v from the Bf16Linear projections: the fp32 masked kernel) vs with `bf16_products=True`
added to its packed_attention calls (long causal sequences on torch's SDPA in bf16 where
attention_cpu.bf16_sdpa_is_fast()), the fp32 engine as reference, interleaved in one process.
The second side is what wiring `attention_bf16_products` into pooler/models/llama.py would give
(not wired: the wrapper here stands in for it).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/decoder_bf16_attention.py
        [--lengths 2048,8192] [--layers 2] [--rounds 3]

Model: a Qwen3-0.6B shape (hidden 1024, MLP 3072, 16 q heads / 8 k/v heads x 128) cut to
--layers layers, seeded random weights; one document of random ids per length. Prints fp32
time / bf16 time per side (median of the rounds) and the pooled vector's cosine to fp32's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import pooler.models.llama as llama
    from pooler import Engine
    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu
    from tests.models.tiny_task_models import save_decoder_model

    print(f"cpu: {cpu_features().summary()}; threads {torch.get_num_threads()}; bf16 SDPA "
          f"route here: {attention_cpu.bf16_sdpa_is_fast()}")
    dest = Path(tempfile.mkdtemp(prefix="decoder_bf16_"))
    save_decoder_model(dest, "qwen3", "base", vocab_size=97, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=args.layers,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=8192)
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 8192
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))

    real = llama.packed_attention
    products = [False]

    def attention(*a, **kw):  # the wiring stand-in
        if products[0]:
            kw["bf16_products"] = True
        return real(*a, **kw)
    llama.packed_attention = attention
    common = dict(device="cpu", max_model_len=8192)
    fp32 = Engine(str(dest), **common)
    bf16 = Engine(str(dest), **common, dtype="bfloat16", precision_check="off")
    runs = [("fp32", fp32, False), ("bf16 as today", bf16, False),
            ("bf16 + bf16_products", bf16, True)]
    for length in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(length)
        prompts = [{"prompt_token_ids": torch.randint(1, 97, (length,), generator=g).tolist()}]
        vecs, times = {}, {name: [] for name, _, _ in runs}
        for name, engine, flag in runs:  # warm-up and the vectors
            products[0] = flag
            vecs[name] = np.asarray(engine.embed(prompts, use_tqdm=False)[0].embedding)
        for r in range(args.rounds):
            for name, engine, flag in (runs if r % 2 == 0 else runs[::-1]):
                products[0] = flag
                start = time.perf_counter()
                engine.embed(prompts, use_tqdm=False)
                times[name].append(time.perf_counter() - start)
        ref = statistics.median(times["fp32"])
        for name, _, _ in runs[1:]:
            t = statistics.median(times[name])
            a, b = vecs["fp32"], vecs[name]
            cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
            print(f"  L={length} {name}: {t:.3f} s vs fp32 {ref:.3f} s -> {ref / t:.2f}x; "
                  f"cosine to fp32 {cos:.6f}", flush=True)


if __name__ == "__main__":
    main()
