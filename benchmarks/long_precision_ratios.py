"""int8 and bf16 against fp32 on one long document, as a user runs them: `Engine(folder,
quantization="int8")` and `Engine(folder, dtype="bfloat16")` on a ModernBERT-base shape and a
GTE-base shape (seeded random weights, fewer layers than the real models: per-layer cost is
what the ratios compare), interleaved in one process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/long_precision_ratios.py \\
        [--families modernbert,gte] [--lengths 2048,8192] [--layers 3] [--rounds 2]

Prints, per family: what the load-time precision gate decided with its default policy
("fallback": which step shapes it timed, and what it kept), the layers each engine swapped
(Int8Linear / Bf16Linear / left fp32), which attention path each call took (C kernel fp32 or
bf16, or torch), and per length the wall time of one document per engine (the median of
`--rounds` interleaved rounds: int8, bf16, fp32, then reversed), the ratio fp32 / candidate
(>1: faster) and the cosine of the pooled vector to fp32's.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(family: str, dest: Path, layers: int) -> None:
    from tests.models.modernbert_folders import build_modernbert
    from tests.models.rotary_folders import build_family

    if family == "modernbert":  # ModernBERT-base: 768, GeGLU 1152, 12 heads x 64, window 128
        build_modernbert(dest, hidden_size=768, intermediate_size=1152, num_hidden_layers=layers,
                         num_attention_heads=12, local_attention=128,
                         max_position_embeddings=8192)
    else:  # gte-base-en-v1.5: 768, GeGLU 3072, 12 heads x 64
        build_family(dest, family, hidden_size=768, intermediate_size=3072,
                     num_hidden_layers=layers, num_attention_heads=12,
                     max_position_embeddings=8192)
    import json
    # the tiny test tokenizer says 128: let the engine take 8k-token documents
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 8192
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))


def attention_log():
    """Record which attention path each packed_attention call takes."""
    import pooler.layers.attention as attention

    seen: collections.Counter = collections.Counter()
    original = attention.attention_on_cpu

    def spy(q, *args, **kwargs):
        out = original(q, *args, **kwargs)
        bf16_products = args[7] if len(args) > 7 else kwargs.get("bf16_products")
        kind = "torch" if out is None else (
            "C bf16" if q.dtype == torch.bfloat16 or bf16_products else "C fp32")
        seen[f"{kind} (q {str(q.dtype)[6:]}, {q.shape[0]} tokens)"] += 1
        return out
    attention.attention_on_cpu = spy
    return seen


def layer_kinds(engine) -> str:
    from pooler.layers.linear import Bf16Linear
    from pooler.layers.quantization import Int8Linear

    kinds = collections.Counter()
    for name, m in engine.core.model_runner.model.backbone.named_modules():
        if isinstance(m, (Int8Linear, torch.nn.Linear)):
            kinds[f"{type(m).__name__}:{name.split('.')[-1]}"] += 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="modernbert,gte")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gate", action="store_true",
                        help="also load each precision with the default gate and print it")
    args = parser.parse_args()

    from pooler import Engine
    from pooler.cpu_features import cpu_features

    print(f"cpu: {cpu_features().summary()}; threads {torch.get_num_threads()}; load "
          f"{os.getloadavg()[0]:.1f}")
    seen = attention_log()
    for family in args.families.split(","):
        folder = Path(tempfile.mkdtemp(prefix=f"longprec_{family}_"))
        build(family, folder, args.layers)
        common = dict(device="cpu", max_model_len=8192)
        if args.gate:
            for kw in (dict(quantization="int8"), dict(dtype="bfloat16")):
                e = Engine(str(folder), **common, **kw)
                d = e.core.model_runner.precision_decision
                print(f"{family} gate {kw}: precision_path={e.precision_path}; "
                      f"{d.reason if d else 'bf16: see log'}")
                del e
        engines = {"fp32": Engine(str(folder), **common),
                   "int8": Engine(str(folder), **common, quantization="int8",
                                  precision_check="off"),
                   "bf16": Engine(str(folder), **common, dtype="bfloat16",
                                  precision_check="off")}
        for name, e in engines.items():
            print(f"{family} {name}: {e.precision_path}; {layer_kinds(e)}")
        g = torch.Generator().manual_seed(0)
        for length in (int(x) for x in args.lengths.split(",")):
            ids = [1] + torch.randint(5, 290, (length - 2,), generator=g).tolist() + [2]
            times = {n: [] for n in engines}
            vecs = {}
            for name, e in engines.items():  # warm-up (and the vectors), one call each
                seen.clear()
                vecs[name] = np.asarray(e.embed({"prompt_token_ids": ids},
                                                use_tqdm=False)[0].embedding)
                print(f"  L={length} {name} attention: {dict(seen)}")
            order = list(engines)
            for r in range(args.rounds):
                for name in (order if r % 2 == 0 else order[::-1]):
                    start = time.perf_counter()
                    engines[name].embed({"prompt_token_ids": ids}, use_tqdm=False)
                    times[name].append(time.perf_counter() - start)
            fp32 = statistics.median(times["fp32"])
            for name in ("int8", "bf16"):
                t = statistics.median(times[name])
                a, b = vecs["fp32"], vecs[name]
                cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
                print(f"  L={length} {name}: {t:.2f} s vs fp32 {fp32:.2f} s -> "
                      f"{fp32 / t:.2f}x; cosine to fp32 {cos:.6f}; load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
        del engines


if __name__ == "__main__":
    main()
