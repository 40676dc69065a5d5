"""The fp32 GEMMs of one short query, alone: MiniLM's 24 linear layers (6 x qkv 384->1152,
out 384->384, up 384->1536, down 1536->384) chained on M tokens, through oneDNN on prepacked
weights (what pooler runs, pooler/layers/linear.py) and through ONNX Runtime's MLAS (the same
MatMul+Add chain as an ONNX graph). Same random weights, interleaved rounds in one process.

    python benchmarks/gemm_chain_vs_mlas.py [--threads 2] [--tokens 12]

Needs the bench-peers extra (onnx, onnxruntime). The weights (42 MB) do not fit this machine's
L3, so each pass streams them from memory, as a real query does.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pooler.bench.common import median_call_seconds  # noqa: E402

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]  # (in, out) per layer, in order


def ort_chain(weights, tokens: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i % 4 == 0:  # the qkv output: keep its first third (q), as attention would reduce it
            nodes.append(helper.make_node("Slice", [prev, "start", "end", "axis"], [f"s{i}"]))
            prev = f"s{i}"
    inits += [numpy_helper.from_array(np.array([v], np.int64), n)
              for n, v in (("start", 0), ("end", 384), ("axis", 1))]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, 384])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [tokens, 384])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def onednn_chain(weights):
    linear = torch.ops.mkldnn._linear_pointwise.default
    packed = [(torch.ops.mkldnn._reorder_linear_weight(torch.from_numpy(w.T.copy())),
               torch.from_numpy(b)) for w, b in weights]

    def run(x: np.ndarray) -> np.ndarray:
        h = torch.from_numpy(x)
        for i, (w, b) in enumerate(packed):
            h = linear(h, w, b, "none", [], "")
            if i % 4 == 0:
                h = h[:, :384].contiguous()
        return h.numpy()
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    weights = [((rng.standard_normal((k, n)) * 0.05).astype(np.float32),
                rng.standard_normal(n).astype(np.float32)) for _ in range(6) for k, n in SHAPES]
    x = rng.standard_normal((args.tokens, 384)).astype(np.float32)
    sides = {"oneDNN (pooler)": onednn_chain(weights),
             "MLAS (onnxruntime)": ort_chain(weights, args.tokens, args.threads)}
    a, b = (fn(x) for fn in sides.values())
    print(f"max |difference| {np.abs(a - b).max():.2e} (relative "
          f"{np.abs(a - b).max() / np.abs(b).max():.1e})")
    results = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, fn in sides.items():
            results[name].append(median_call_seconds(lambda: fn(x), 100) * 1e3)
    for name, values in results.items():
        print(f"threads {args.threads} tokens {args.tokens} {name:20s} median "
              f"{statistics.median(values):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
