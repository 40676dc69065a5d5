"""Where a single query's slow calls come from: Engine.embed of one short query, N times, with
each call's parts and what happened during it.

    .venv/bin/python benchmarks/single_query_tails.py [--model FOLDER|bert-base] [--calls 2000]
        [--threads 2] [--quantization int8] [--modes default,freeze,loop] [--http]

Per call: wall time, and its parts by perf_counter (tokenize = the input processor, forward =
the backbone, pool = the pooler, rest = scheduling, bookkeeping and output conversion); the
Python garbage collections that ran inside it (gc.callbacks: generation and milliseconds); the
process's involuntary context switches (another process took a core: machine noise, not
pooler), minor page faults (fresh memory pages touched), the thread count its step ran with
(pooler/worker/step_threads.py), the process's CPU time, and whether it was the first call at
its token count. A call is slow when it takes more
than 1.5x the p50 (issue 44's target is p99 within 1.5x of p50 on a quiet machine); the report
says how many slow calls coincide with each cause, and the share of slow calls a cause can
explain.

--modes lists the settings timed in alternating blocks of calls in one process (drift on a
shared machine reaches them alike): "default" (the caller's thread steps the engine, Python's
GC thresholds, nothing frozen), "loop" (the engine's background loop runs the steps and the
caller waits on its future, the hand-off every server request makes), "freeze" (gc.freeze()
after load: the loaded model's objects leave the collector's generations, so a full
collection walks only what came after) and "off" (gc.disable() while timing; a bound, not an
option). After the timed calls it prints what one full collection
costs with the loaded objects in the generations and after gc.freeze(): the stall a gen-2
collection would add to the call it lands in.

--http: the same queries through `POST /v1/embeddings` one at a time (the server in a thread of
this process, pooler/bench/serve_thread.py; the client in a separate process, so only the
server's collections are counted): per GC setting, the client's p50/p90/p99 and the server's
collections by generation, with the calls they overlapped.

Process CPU time per call at --threads 1 is the call's own work (no OpenMP peer spinning
while it waits), so its p99/p50 is pooler's tail with the machine's other processes taken
out; wall p99/p50 on a shared machine is mostly theirs. Findings: docs/dev/journal.md, "A
single query's tail (issue 44, items 3-4)".
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

_REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_REPO))


class CallTrace:
    """Timers and event counters of the call in progress, reset per call."""

    def __init__(self):
        self.parts: dict[str, float] = {}
        self.gcs: list[tuple[int, float]] = []  # (generation, ms)
        self.threads = 0  # torch's intra-op threads during the forward (step_threads.py)
        self.tokens = 0   # the query's token count
        self.seen_tokens: set[int] = set()  # token counts run before (warm-up included)
        self._gc_start = 0.0
        self.reset()

    def reset(self):
        self.parts = {"tokenize": 0.0, "forward": 0.0, "pool": 0.0}
        self.gcs = []

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] += (time.perf_counter() - start) * 1e3
        return wrapper

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gcs.append((info["generation"], (time.perf_counter() - self._gc_start) * 1e3))


def _engine(model: str, threads: int, quantization: str | None):
    from pooler.engine.llm import Engine

    if not Path(model).is_dir():
        from pooler.bench.shape_models import SHAPE_MODELS, shape_folder

        if model in SHAPE_MODELS:
            model = str(shape_folder(model, tiny=False))
    return Engine(model, num_threads=threads, quantization=quantization)


def _instrument(engine, trace: CallTrace) -> None:
    import torch

    runner = engine.core.model_runner
    process = trace.timed("tokenize", engine.processor.process)

    def process_noting_tokens(*args, **kwargs):
        out = process(*args, **kwargs)
        trace.tokens = sum(len(p.prompt_token_ids) for p in out)
        return out
    engine.processor.process = process_noting_tokens
    backbone = runner.model.backbone
    forward = trace.timed("forward", backbone.forward)

    def forward_noting_threads(*args, **kwargs):
        trace.threads = torch.get_num_threads()
        return forward(*args, **kwargs)
    backbone.forward = forward_noting_threads
    runner.pooling_runner.pool = trace.timed("pool", runner.pooling_runner.pool)


def _usage() -> tuple[int, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_nivcsw, ru.ru_minflt


def run_block(engine, trace: CallTrace, texts: list[str], mode: str) -> list[dict]:
    calls = []
    if mode == "off":
        gc.disable()
    try:
        for text in texts:
            trace.reset()
            csw0, flt0 = _usage()
            cpu0 = time.process_time()
            start = time.perf_counter()
            engine.embed(text)
            wall = (time.perf_counter() - start) * 1e3
            cpu = (time.process_time() - cpu0) * 1e3
            csw1, flt1 = _usage()
            parts = dict(trace.parts)
            parts["rest"] = wall - sum(parts.values())
            first = trace.tokens not in trace.seen_tokens
            trace.seen_tokens.add(trace.tokens)
            calls.append({"ms": wall, "parts": parts, "gcs": list(trace.gcs),
                          "tokens": trace.tokens, "first_at_length": first,
                          "nivcsw": csw1 - csw0, "minflt": flt1 - flt0,
                          "threads": trace.threads, "cpu_ms": cpu})
    finally:
        gc.enable()
    return calls


def report(mode: str, calls: list[dict]) -> None:
    ms = np.array([c["ms"] for c in calls])
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    slow = [c for c in calls if c["ms"] > 1.5 * p50]
    print(f"\n[{mode}] {len(calls)} calls: p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}  max "
          f"{ms.max():.2f} ms; p99/p50 {p99 / p50:.2f}; slow (> 1.5x p50): {len(slow)} "
          f"({100 * len(slow) / len(calls):.1f}%)")
    cpu = np.array([c["cpu_ms"] for c in calls])
    c50, c99 = np.percentile(cpu, [50, 99])
    # The work a call did, whatever the machine's other processes did: at --threads 1 (no
    # OpenMP peer spinning while it waits) a call's own tail, the machine's removed.
    print(f"  process CPU time per call: p50 {c50:.2f}  p99 {c99:.2f} ms; p99/p50 "
          f"{c99 / c50:.2f}")
    gcs = [g for c in calls for g in c["gcs"]]
    for gen in (0, 1, 2):
        times = [t for g, t in gcs if g == gen]
        if times:
            print(f"  gen-{gen} collections during calls: {len(times)}, median "
                  f"{np.median(times):.2f} ms, max {max(times):.2f} ms")
    parts = {k: np.median([c["parts"][k] for c in calls]) for k in calls[0]["parts"]}
    print("  median parts (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
    if not slow:
        return
    causes = {
        "a gen-2 GC": lambda c: any(g == 2 for g, _ in c["gcs"]),
        "a gen-1 GC": lambda c: any(g == 1 for g, _ in c["gcs"]),
        "any GC > 1 ms": lambda c: sum(t for _, t in c["gcs"]) > 1.0,
        "an involuntary context switch": lambda c: c["nivcsw"] > 0,
        "> 50 minor page faults": lambda c: c["minflt"] > 50,
        "the first call at its token count": lambda c: c["first_at_length"],
        "fewer threads than configured": lambda c: c["threads"] < max(x["threads"]
                                                                      for x in calls),
    }
    fast = [c for c in calls if c["ms"] <= 1.5 * p50]
    for name, test in causes.items():
        n_slow = sum(map(test, slow))
        n_fast = sum(map(test, fast))
        print(f"  slow calls with {name}: {n_slow}/{len(slow)} (fast calls: {n_fast}/"
              f"{len(fast)})")
    # CPU time of all our threads over wall time: ~threads when every thread ran (or spun)
    # the whole call; lower when the call waited for a core (another process ran).
    busy = {name: np.median([c["cpu_ms"] / c["ms"] for c in group])
            for name, group in (("slow", slow), ("fast", fast))}
    print(f"  process CPU time / wall time, median: slow calls {busy['slow']:.2f}, fast calls "
          f"{busy['fast']:.2f}; slow calls' median extra CPU ms "
          f"{np.median([c['cpu_ms'] for c in slow]) - np.median([c['cpu_ms'] for c in fast]):+.2f}"
          f" for {np.median([c['ms'] for c in slow]) - np.median([c['ms'] for c in fast]):+.2f}"
          " extra wall ms")
    excess = {k: np.median([c["parts"][k] - parts[k] for c in slow]) for k in parts}
    print("  slow calls' median excess over the median call, by part (ms): "
          + ", ".join(f"{k} {v:+.2f}" for k, v in excess.items()))
    worst = sorted(calls, key=lambda c: -c["ms"])[:5]
    for c in worst:
        print(f"  worst {c['ms']:.2f} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                       c["parts"].items())
              + f"; gc {c['gcs']}; ctx switches {c['nivcsw']}; page faults {c['minflt']}; "
              f"threads {c['threads']}; CPU {c['cpu_ms']:.2f} ms; {c['tokens']} tokens"
              f"{' (first at this length)' if c['first_at_length'] else ''}")


_HTTP_CLIENT = """
import httpx, json, sys, time
url, model, texts = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
spans = []
with httpx.Client(timeout=60) as client:
    for text in texts:
        start = time.time()
        response = client.post(url + "/v1/embeddings", json={"input": text, "model": model})
        spans.append((start, time.time()))
        response.raise_for_status()
print(json.dumps(spans))
"""


def run_http(engine, texts: list[str], modes: list[str], blocks: int, per_block: int) -> None:
    """The --http mode (module docstring)."""
    import json
    import subprocess

    import httpx

    from pooler.bench.serve_thread import serve_in_thread

    events: list[tuple[int, float, float]] = []  # (generation, start, end), time.time()
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.time()
        else:
            events.append((info["generation"], started[0], time.time()))

    spans: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with serve_in_thread(engine) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        client = [sys.executable, "-c", _HTTP_CLIENT, url, model]
        subprocess.run(client, input=json.dumps(texts[:20]), text=True, check=True,
                       capture_output=True)  # warm up
        gc.callbacks.append(on_gc)
        for block in range(blocks):
            for mode in (modes if block % 2 == 0 else modes[::-1]):
                if mode == "freeze":
                    gc.collect()
                    gc.freeze()
                elif mode == "off":
                    gc.disable()
                chunk = [texts[(block * per_block + i) % len(texts)] for i in range(per_block)]
                out = subprocess.run(client, input=json.dumps(chunk), text=True, check=True,
                                     capture_output=True).stdout
                spans[mode].extend(json.loads(out))
                gc.unfreeze()
                gc.enable()
        gc.callbacks.remove(on_gc)
    for mode in modes:
        ms = np.array([(end - start) * 1e3 for start, end in spans[mode]])
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        print(f"\n[http, {mode}] {len(ms)} calls: p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}  "
              f"max {ms.max():.2f} ms; p99/p50 {p99 / p50:.2f}")
        outliers = [(i % per_block, float(x)) for i, x in enumerate(ms) if x > 5 * p50]
        if outliers:  # position 0: a block's first call, after the client process started
            print("  calls above 5x p50 (position in their block of "
                  f"{per_block}, ms): " + ", ".join(f"{i}: {x:.1f}" for i, x in outliers[:10]))
        for gen in (0, 1, 2):
            inside = [(a, b) for g, a, b in events if g == gen]
            hit = [max((e - s) * 1e3 for s, e in spans[mode] if s <= b and e >= a)
                   for a, b in inside if any(s <= b and e >= a for s, e in spans[mode])]
            if hit:
                print(f"  server gen-{gen} collections during its calls: {len(hit)}; the calls "
                      f"they overlapped took (ms): {', '.join(f'{h:.1f}' for h in hit[:10])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="model folder or a bench shape name (bert-base); default MiniLM")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per setting")
    parser.add_argument("--blocks", type=int, default=4,
                        help="alternating blocks per setting (calls are split among them)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed calls first (the bench's single_query warms up with 10)")
    parser.add_argument("--http", action="store_true",
                        help="through POST /v1/embeddings (module docstring)")
    parser.add_argument("--modes", default="default,freeze",
                        help="comma-separated settings from default, freeze, off, loop "
                        "(module docstring)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(modes) - {"default", "freeze", "off", "loop"}:
        parser.error("--modes takes default, freeze, off and loop")
    if args.http and "loop" in modes:
        parser.error("--http always goes through the loop: leave 'loop' out of --modes")
    from pooler.bench import corpus
    from pooler.model_folder import DEFAULT_MODEL

    engine = _engine(args.model or DEFAULT_MODEL, args.threads, args.quantization)
    if args.http:
        texts = corpus.queries(max(200, args.calls // args.blocks), seed=7)
        print(f"HTTP; threads {args.threads}; load average {os.getloadavg()}; model "
              f"{args.model or DEFAULT_MODEL}; path {engine.precision_path}")
        run_http(engine, texts, modes, args.blocks, args.calls // args.blocks)
        print(f"load average after {os.getloadavg()}")
        return 0
    trace = CallTrace()
    _instrument(engine, trace)
    gc.callbacks.append(trace.on_gc)
    texts = corpus.queries(max(200, args.calls // args.blocks), seed=7)
    for text in texts[:args.warmup]:
        engine.embed(text)
    print(f"python {sys.version.split()[0]}, gc thresholds {gc.get_threshold()}, objects "
          f"tracked after load {len(gc.get_objects())}; threads {args.threads}; load average "
          f"{os.getloadavg()}; {os.cpu_count()} CPUs; model {args.model or DEFAULT_MODEL}"
          f"{' int8' if args.quantization else ''}; path {engine.precision_path}")
    per_block = args.calls // args.blocks
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for block in range(args.blocks):
        order = modes if block % 2 == 0 else modes[::-1]
        for mode in order:
            if mode == "freeze":
                gc.freeze()
            elif mode == "loop":
                engine.start_background_loop()
            block_texts = [texts[(block * per_block + i) % len(texts)] for i in range(per_block)]
            results[mode].extend(run_block(engine, trace, block_texts, mode))
            if mode == "freeze":
                gc.unfreeze()
            elif mode == "loop":
                engine.shutdown()  # back to stepping in the caller's thread
    print(f"load average after {os.getloadavg()}")
    # What a full (gen-2) collection would add to the call it lands in, with the loaded
    # objects in the collector's generations and after gc.freeze().
    for frozen in (False, True):
        if frozen:
            gc.freeze()
        start = time.perf_counter()
        gc.collect()
        print(f"a full gc.collect() {'after gc.freeze()' if frozen else 'as loaded'}: "
              f"{(time.perf_counter() - start) * 1e3:.1f} ms ({len(gc.get_objects())} objects "
              "in the generations)")
    gc.unfreeze()
    for mode in modes:
        report(mode, results[mode])
    return 0


if __name__ == "__main__":
    sys.exit(main())
