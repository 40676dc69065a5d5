"""The workload registry: a workload is a name plus a function that lists its sides.

A *side* is one library doing the workload's job (pooler, or the peer a user would otherwise
run). Each side runs in its own subprocess (pooler/bench/side.py), so its peak RSS is its own and
no library's warm state helps another. Adding a workload = one module in pooler/bench/workloads/ that
calls `register` (found automatically); see pooler/bench/workloads/embed.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

# A workload's metric: "throughput" compares texts/s (higher is better), "latency" compares
# the p50 of one-at-a-time calls (lower is better).
METRICS = ("throughput", "latency")


@dataclass
class BenchOptions:
    """Everything a side needs to rebuild its inputs in a fresh process (JSON-serializable)."""
    model: str
    threads: int
    quick: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    quantization: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 256
    out_dir: str = ""            # where sides drop their outputs (embeddings) for accuracy checks
    extra: dict = field(default_factory=dict)  # workload-specific knobs

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SideResult:
    side: str
    role: str                     # "pooler" or "peer"
    texts: int = 0                # inputs processed in the timed part
    tokens: int = 0               # real tokens (special tokens included, padding not)
    seconds: float = 0.0          # wall time of the timed part
    latencies_ms: list[float] = field(default_factory=list)  # per call, latency workloads
    peak_rss_mb: float = 0.0      # whole subprocess, model load included
    loaded_rss_mb: float = 0.0    # after loading the model, before the timed part
    note: str = ""                # e.g. the batch size a sweep picked
    outputs_file: str | None = None  # .npy of outputs, compared across sides by the runner
    # What computed a pooler side's GEMMs ("float32: C kernel avx512 + oneDNN",
    # "onednn-bf16 (avx512_bf16)", ...); empty for peers. Filled by side.py.
    precision_path: str = ""
    # A side that times a pooler precision variant and pooler fp32 in one process, in
    # alternating rounds (embed's "pooler int8 interleaved"): variant / fp32 texts/s per round.
    interleaved_vs_fp32: list[float] = field(default_factory=list)
    # Seconds of the timed part by phase (image_embed: decode, preprocess, model), medians.
    phases_s: dict[str, float] = field(default_factory=dict)
    # FLOPs of the model's forward over the timed inputs, for workloads whose inputs have no
    # single per-token count (images): the % ceiling column is then model_flops / seconds.
    model_flops: float = 0.0
    # Inputs per second of each timed round, for sides timed in alternating rounds with
    # their peers in one process (image_embed): ratios round by round.
    rounds_per_s: list[float] = field(default_factory=list)
    # Why this library could not run in a side that times several libraries in one process.
    error: str | None = None
    # A pooler side's step-size label -> the path steps of that size take ("1-48 tokens":
    # "fp32 C stack (avx512)", ...: Engine.step_paths()). Filled by side.py.
    step_paths: dict[str, str] = field(default_factory=dict)
    # fp32 GEMM GFLOP/s measured in this side's process right after its timed part (workloads
    # with a ceiling column, full runs only): the runner takes the share of the ceiling against
    # the fastest GEMM measured in the invocation. Filled by side.py.
    gemm_gflops: list[float] = field(default_factory=list)


@dataclass
class Side:
    name: str
    role: str                                   # "pooler" or "peer"
    # Runs inside the side's own subprocess. A side that times several libraries in one
    # process, in alternating rounds (image_embed), returns one SideResult per library.
    run: Callable[[BenchOptions], "SideResult | list[SideResult]"]
    # Why this side cannot run here (e.g. an architecture pooler does not run natively yet):
    # it lands in the table as SKIPPED with this reason, and no process is started.
    skip: str | None = None


@dataclass
class Workload:
    name: str
    description: str
    metric: str                                 # one of METRICS
    sides: Callable[[BenchOptions], list[Side]]
    baseline: str                               # the peer side ratios are taken against
    # Model FLOPs per real token for these inputs (for the ceiling column); None to skip.
    flops_per_token: Callable[[BenchOptions], float] | None = None
    # Why the workload cannot run here (e.g. a model in ../shared is absent), or None.
    skip: Callable[[BenchOptions], str | None] | None = None
    # Sides compared against a peer other than `baseline` (a workload with several shapes,
    # e.g. 1 x 100 and 10 x 100 reranks): side name -> its own baseline side.
    baselines: dict[str, str] = field(default_factory=dict)
    # Lines printed under the workload's table (runner.pooler_ratio_lines): its rows -> lines.
    report_lines: Callable[[list], list[str]] | None = None

    def baseline_of(self, side: str) -> str:
        return self.baselines.get(side, self.baseline)


WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.metric not in METRICS:
        raise ValueError(f"workload {workload.name!r}: metric must be one of {METRICS}.")
    WORKLOADS[workload.name] = workload
    return workload


def load_workloads() -> dict[str, Workload]:
    """Import every module of pooler/bench/workloads (each registers itself); return the registry."""
    import importlib
    import pkgutil

    from pooler.bench import workloads

    for info in sorted(pkgutil.iter_modules(workloads.__path__), key=lambda m: m.name):
        importlib.import_module(f"{workloads.__name__}.{info.name}")
    return WORKLOADS


def get_workload(name: str) -> Workload:
    workloads = load_workloads()
    if name not in workloads:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(workloads)}.")
    return workloads[name]
