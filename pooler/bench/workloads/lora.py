"""LoRA workload (issue 31): 8 adapters on all-MiniLM-L6-v2, mixed traffic, three ways.

- `base alone`: the corpus embedded by the base model (the baseline).
- `8 adapters mixed`: one engine serving the base + 8 LoRA adapters; every text names one of
  the 8 adapters (round robin) and all are submitted together, so each batch mixes adapters.
  Its texts/s ratio is the cost of the adapters (target >= 0.8x); its loaded RSS against the
  base's is their memory (target < 1.1x).
- `8 merged models`: what serving the adapters without LoRA takes: 8 engines, each on peft's
  merged model of one adapter, each embedding its own texts (memory: 8 models resident).

Adapters are seeded random (rank 16 on query/key/value and every dense layer, as a typical
PEFT config targets them), built once with peft and cached with their merged models
(POOLER_BENCH_CACHE). The mixed side's outputs are saved and compared (cosine) with the merged
side's, which must agree to fp32 noise; the base side saves none (adapters change outputs).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import cached_folder, minilm_path, pooler_engine, save_array
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

NUM_ADAPTERS = 8
RANK = 16
DEFAULT_TEXTS = 800
_TARGETS = ["query", "key", "value", "dense"]


def _texts(opts: BenchOptions) -> list[str]:
    n = 72 if opts.quick else int(opts.extra.get("corpus_size") or DEFAULT_TEXTS)
    return corpus.mixed_corpus(n, seed=31)


def _adapter(i: int) -> Path:
    def build(dest: Path) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import BertModel

        model = BertModel.from_pretrained(minilm_path())
        peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK,
                                                      target_modules=_TARGETS))
        generator = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:
                    param.copy_(0.02 * torch.randn(param.shape, generator=generator))
        peft_model.save_pretrained(dest)
        (dest / "config.json").write_text("{}")  # cached_folder's "finished" marker
    return cached_folder(f"lora-minilm-r{RANK}-{i}", build)


def _merged(i: int) -> Path:
    def build(dest: Path) -> None:
        import shutil

        from peft import PeftModel
        from transformers import BertModel

        base = minilm_path()
        model = PeftModel.from_pretrained(BertModel.from_pretrained(base), _adapter(i))
        model.merge_and_unload().save_pretrained(dest)
        for item in base.iterdir():  # tokenizer and sentence-transformers modules
            if item.name in ("config.json", "model.safetensors", "pytorch_model.bin") or \
                    item.suffix in (".onnx",) or item.name in ("onnx", "openvino"):
                continue
            if item.is_dir():
                shutil.copytree(item, dest / item.name, dirs_exist_ok=True)
            else:
                shutil.copy(item, dest / item.name)
    return cached_folder(f"lora-minilm-r{RANK}-{i}-merged", build)


def _assignments(texts: list[str]) -> list[int]:
    return [i % NUM_ADAPTERS for i in range(len(texts))]


def _run_mixed(engine, texts: list[str], loras: list[str | None]) -> np.ndarray:
    """All texts submitted together, each with its own adapter (None: the base)."""
    from pooler.params import PoolingParams

    processed = engine.processor.process(texts)
    params = {name: engine.verify_params(PoolingParams(task="embed", lora=name))
              for name in set(loras)}
    results = engine.run_processed(processed, [params[n] for n in loras])
    return np.stack([r.data.numpy() for r in results])


def _tokens(engine, texts: list[str]) -> int:
    return sum(len(p.prompt_token_ids) for p in engine.processor.process(texts))


def _base(opts: BenchOptions) -> SideResult:
    texts = _texts(opts)
    engine = pooler_engine(minilm_path(), opts)
    _run_mixed(engine, texts[:16], [None] * 16)  # warm up kernels and allocator
    loaded = rss_mb()
    start = time.perf_counter()
    _run_mixed(engine, texts, [None] * len(texts))
    seconds = time.perf_counter() - start
    return SideResult("base alone", "pooler", len(texts), _tokens(engine, texts), seconds,
                      loaded_rss_mb=loaded)


def _mixed(opts: BenchOptions) -> SideResult:
    from pooler.engine.llm import Engine

    texts = _texts(opts)
    adapters = {f"adapter{i}": str(_adapter(i)) for i in range(NUM_ADAPTERS)}
    engine = Engine(str(minilm_path()), device=opts.device, dtype=opts.dtype,
                    max_num_batched_tokens=opts.max_num_batched_tokens,
                    max_num_seqs=opts.max_num_seqs, num_threads=opts.threads,
                    lora_modules=adapters, max_loras=NUM_ADAPTERS)
    loras = [f"adapter{i}" for i in _assignments(texts)]
    _run_mixed(engine, texts[:16], loras[:16])
    loaded = rss_mb()
    start = time.perf_counter()
    outputs = _run_mixed(engine, texts, loras)
    seconds = time.perf_counter() - start
    manager = engine.core.model_runner.lora
    tensors_mb = sum(w.num_bytes() for w in manager.resident.values()) / 2**20
    return SideResult("8 adapters mixed", "pooler", len(texts), _tokens(engine, texts),
                      seconds, loaded_rss_mb=loaded,
                      note=f"{NUM_ADAPTERS} adapters r={RANK}: {tensors_mb:.1f} MB of tensors",
                      outputs_file=save_array(opts, "lora-mixed", outputs))


def _merged_models(opts: BenchOptions) -> SideResult:
    texts = _texts(opts)
    engines = [pooler_engine(_merged(i), opts) for i in range(NUM_ADAPTERS)]
    picks = _assignments(texts)
    groups = [[j for j, a in enumerate(picks) if a == i] for i in range(NUM_ADAPTERS)]
    for engine in engines:
        _run_mixed(engine, texts[:2], [None] * 2)
    loaded = rss_mb()
    outputs = np.zeros((len(texts), engines[0].embedding_size), dtype=np.float32)
    start = time.perf_counter()
    for engine, group in zip(engines, groups):
        outputs[group] = _run_mixed(engine, [texts[j] for j in group], [None] * len(group))
    seconds = time.perf_counter() - start
    return SideResult("8 merged models", "pooler", len(texts), _tokens(engines[0], texts),
                      seconds, loaded_rss_mb=loaded, note="one engine per merged adapter",
                      outputs_file=save_array(opts, "lora-merged", outputs))


def _sides(opts: BenchOptions) -> list[Side]:
    return [Side("base alone", "pooler", _base),
            Side("8 adapters mixed", "pooler", _mixed),
            Side("8 merged models", "pooler", _merged_models)]


register(Workload(
    name="lora",
    description="8 LoRA adapters on all-MiniLM-L6-v2, mixed traffic: one engine with the "
                "adapters batched together vs the base alone (throughput) and vs 8 merged "
                "models (memory)",
    metric="throughput", sides=_sides, baseline="base alone",
    # match: the mixed side's outputs against the merged models' (must agree)
    baselines={"8 merged models": "8 adapters mixed"}))
