"""Every int8 path this machine can execute (pooler/kernels/int8_gemm.c per instruction set, and
the portable torch path) against an exact reference of its scheme, on shapes that hit the
kernel's edges: k not a multiple of 4, partial 32-column panels, pairs of whole panels (the VNNI
build's 64-column tiles) beside a lone one, one row, row blocks of uneven sizes (row_blocks)
and 12/6-row tiles with shorter remainders (11 rows: the AVX2 build's 6 + 5); the LayerNorm
fused after the GEMM. An AVX-512 VNNI machine runs the AVX2 build too (as
POOLER_CPU_KERNELS=avx2 would pick it)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pooler import cpu_features as cpu_features_module
from pooler.kernels import int8_cpu
from pooler.layers.quantization import Int8Linear, record_input_ranges, smoothing_factors

C_PATHS = int8_cpu.runnable_paths()
SHAPES = [(1, 8, 5), (11, 40, 50), (13, 100, 70), (37, 384, 96), (200, 130, 33), (101, 64, 160)]  # (tokens, in, out)


def _linear(k: int, n: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n)


def _codes(x: torch.Tensor, levels: int):
    """Per-token unsigned codes in [0, levels] with a zero point (the range always holds 0),
    rounded half to even as the vector conversion does, in float32 as the kernel computes."""
    lo, hi = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / levels).clamp(min=1e-30)
    inv = 1.0 / scale
    zp = torch.round(-lo * inv).clamp(0, levels)
    codes = (torch.round(x * inv) + zp).clamp(0, levels)
    return codes, scale, zp


def _product(layer: Int8Linear, codes, scale, zp) -> torch.Tensor:
    """scale * (codes W^T - zp colsum) * w_scale in exact arithmetic; on the AVX2 path each
    pair of consecutive products is an int16 sum that saturates (VPMADDUBSW)."""
    w = layer.weight_q.double()
    if layer.path == "avx2":
        k = codes.shape[1]
        c = torch.nn.functional.pad(codes.double(), (0, k % 2))  # [m, k even]
        wp = torch.nn.functional.pad(w, (0, k % 2))  # [n, k even]
        pairs = c[:, None, 0::2] * wp[None, :, 0::2] + c[:, None, 1::2] * wp[None, :, 1::2]
        raw = pairs.clamp(-32768, 32767).sum(-1)  # [m, n]
    else:
        raw = codes.double() @ w.t()  # exact in float64
    return (raw - zp.double() * w.sum(1)) * scale.double() * layer.w_scale.double()


def _scheme_reference(layer: Int8Linear, x: torch.Tensor, levels: int,
                      outlier_rows: torch.Tensor | None = None) -> torch.Tensor:
    """What int8_gemm.c computes for x (already divided by any smoothing). outlier_rows: [m]
    bool, the rows that get the residual pass (their x minus the dequantized codes, quantized
    on its own)."""
    codes, scale, zp = _codes(x, levels)
    y = _product(layer, codes, scale, zp) + layer.bias.double()
    if outlier_rows is not None and outlier_rows.any():
        rest = x[outlier_rows] - scale[outlier_rows] * (codes[outlier_rows] - zp[outlier_rows])
        y[outlier_rows] += _product(layer, *_codes(rest, levels))
    return y.float()


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here (needs Linux x86-64 with "
                    "AVX2+FMA or AVX-512 VNNI)")
@pytest.mark.parametrize("path", C_PATHS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_c_path_matches_its_exact_reference(path, m, k, n):
    lib = int8_cpu.int8_kernels(path)
    assert lib is not None and lib.variant == path
    assert lib.levels == (255 if path == "avx512-vnni" else 128)
    linear = _linear(k, n)
    layer = Int8Linear.from_linear(linear, path)
    torch.manual_seed(1)
    x = torch.randn(m, k) * torch.linspace(0.1, 8, m)[:, None]  # rows of very different scale
    with torch.inference_mode():
        out = layer(x)
    ref = _scheme_reference(layer, x, lib.levels)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # and it is an approximation of the fp32 layer (7-bit codes on AVX2 are coarser)
    rel = (out - linear(x)).norm(dim=1) / linear(x).norm(dim=1)
    assert rel.max() < (0.02 if path == "avx512-vnni" else 0.03)


@pytest.mark.skipif("avx2" not in C_PATHS, reason="the AVX2 build does not run here")
def test_avx2_cannot_saturate_int16_pairs():
    """The worst case for VPMADDUBSW: every activation code at its top (128) meeting weight codes
    of one sign at their largest (127). 8-bit codes would saturate (2 * 255 * 127 > 32767);
    2 * 128 * 127 = 32512 must give the exact sum."""
    k, n = 64, 32
    weight = torch.full((n, k), 1.0)
    weight[1::2] = -1.0  # every other column all negative
    layer = Int8Linear(weight, torch.zeros(n), "avx2")
    assert layer.weight_q.abs().min() == 127 and layer.weight_q.abs().max() == 127
    x = torch.ones(3, k)  # every code at the top, zero point 0
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(out, x @ weight.t(), rtol=1e-6, atol=1e-5)


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
@pytest.mark.parametrize("path", C_PATHS)
def test_c_path_edges(path):
    linear = _linear(40, 50)
    layer = Int8Linear.from_linear(linear, path)
    with torch.inference_mode():
        zeros = layer(torch.zeros(3, 40))
        torch.testing.assert_close(zeros, linear.bias.expand(3, -1))  # zero rows: the bias
        x = torch.randn(2, 7, 40)  # any leading shape
        assert layer(x).shape == (2, 7, 50)
        # the thread count does not change a single bit (each output has one owner), on step
        # sizes whose row blocks (int8_gemm.c's row_blocks) come out uneven per thread count
        for m in (12, 13, 100, 301):
            x = torch.randn(m, 40)
            outs = _per_thread_count(lambda: layer(x))
            assert all(torch.equal(outs[0], o) for o in outs[1:]), m


def _per_thread_count(run, counts=(1, 2, 3)) -> list:
    """run() once per torch thread count (restored after)."""
    threads = torch.get_num_threads()
    try:
        outs = []
        for count in counts:
            torch.set_num_threads(count)
            outs.append(run())
        return outs
    finally:
        torch.set_num_threads(threads)


def test_torch_path_close_to_fp32():
    linear = _linear(64, 48)
    layer = Int8Linear.from_linear(linear, "torch")
    torch.manual_seed(2)
    x = torch.randn(7, 64) * torch.linspace(0.1, 10, 7)[:, None]
    with torch.inference_mode():
        out = layer(x)
    rel = (out - linear(x)).norm(dim=1) / linear(x).norm(dim=1)
    assert rel.max() < 0.02
    assert "torch" in repr(layer)


def test_weight_copy_in_place_repacks():
    """A weight reload copies into the buffers: the packed form must follow."""
    path = C_PATHS[0] if C_PATHS else "torch"
    a, b = Int8Linear.from_linear(_linear(16, 40, seed=0), path), \
        Int8Linear.from_linear(_linear(16, 40, seed=1), path)
    x = torch.randn(5, 16)
    with torch.inference_mode():
        a(x)  # packs a's weights
    a.load_state_dict(b.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(a(x), b(x))


@pytest.fixture
def flags(monkeypatch):
    """Pretend the CPU has only these flags (POOLER_CPU_FLAGS), caches cleared around it."""
    def set_flags(value: str | None, kernels: str | None = None):
        for name, v in ((cpu_features_module.FLAGS_ENV, value), ("POOLER_CPU_KERNELS", kernels)):
            if v is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, v)
        cpu_features_module.cpu_features.cache_clear()
    yield set_flags
    monkeypatch.undo()
    cpu_features_module.cpu_features.cache_clear()


def test_path_choice_follows_the_cpu(flags):
    flags("")  # no vector flags (an aarch64 host, or an old x86): the portable path
    assert int8_cpu.runnable_paths() == [] and int8_cpu.int8_path() == "torch"
    assert Int8Linear.from_linear(_linear(8, 8)).path == "torch"
    flags("avx2 fma")
    if "avx2" in C_PATHS:
        assert int8_cpu.int8_path() == "avx2"
    flags(None, kernels="0")  # kernels off by the user
    assert int8_cpu.int8_path() == "torch"
    if "avx2" in C_PATHS:
        flags(None, kernels="avx2")  # the AVX2 build forced on a better CPU
        assert int8_cpu.int8_path() == "avx2"
    if C_PATHS:
        flags(None)
        assert int8_cpu.int8_path() == C_PATHS[0]


def test_unrunnable_path_is_a_clear_error(flags):
    flags("avx2 fma")
    with pytest.raises(ValueError, match="avx512-vnni.*cannot run on this CPU"):
        int8_cpu.int8_kernels("avx512-vnni")


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
@pytest.mark.parametrize("path", C_PATHS)
def test_epilogue_activation_and_residual(path):
    """GELU (erf, tanh), ReLU and the residual add in the kernel's epilogue agree with the same
    ops run after it, on 114 columns: a pair of whole panels, a lone whole one and a partial
    last one."""
    import torch.nn.functional as F

    layer = Int8Linear.from_linear(_linear(40, 114), path)
    torch.manual_seed(3)
    x, residual = torch.randn(30, 40), torch.randn(30, 114)
    with torch.inference_mode():
        plain = layer(x)
        for code, act in ((int8_cpu.ACT_GELU_ERF, F.gelu),
                          (int8_cpu.ACT_GELU_TANH, lambda t: F.gelu(t, approximate="tanh")),
                          (int8_cpu.ACT_RELU, F.relu)):
            torch.testing.assert_close(layer.fused_forward(x, code), act(plain), rtol=1e-5,
                                       atol=2e-6)
        torch.testing.assert_close(layer.fused_forward(x, 0, residual), plain + residual)
    assert Int8Linear.from_linear(_linear(40, 50), "torch").fused_forward(x) is None


def _outlier_input(m: int, k: int, seed: int = 2) -> torch.Tensor:
    """[m, k] tokens whose channels 3 and 17 are ~30x the others (BERT's post-LayerNorm
    outlier channels in miniature)."""
    torch.manual_seed(seed)
    x = torch.randn(m, k)
    x[:, 3] *= 30
    x[:, 17] = x[:, 17] * 30 - 40
    return x


@pytest.mark.parametrize("path", C_PATHS + ["torch"])
def test_smoothing_keeps_the_product_and_cuts_outlier_error(path):
    m, k, n = 40, 130, 70
    linear = _linear(k, n)
    with torch.no_grad():  # trained models give their outlier channels small weights
        linear.weight[:, [3, 17]] /= 10
    x = _outlier_input(m, k)
    model = nn.Sequential(linear)
    ranges = record_input_ranges(model, lambda: model(x[:8]))  # the calibration forward
    assert set(ranges) == {"0"} and ranges["0"].shape == (k,)
    smooth = smoothing_factors(ranges["0"], linear.weight)
    plain = Int8Linear.from_linear(linear, path)
    smoothed = Int8Linear.from_linear(linear, path, smooth=smooth)
    with torch.inference_mode():
        ref, out_plain, out_smooth = linear(x), plain(x), smoothed(x)
    if path != "torch":  # the kernel quantizes x / s: the scheme's exact reference on it
        lib = int8_cpu.int8_kernels(path)
        exact = _scheme_reference(smoothed, x * smooth.reciprocal(), lib.levels)
        torch.testing.assert_close(out_smooth, exact, rtol=1e-5, atol=1e-5)
    err = lambda y: ((y - ref).norm(dim=1) / ref.norm(dim=1)).max().item()  # noqa: E731
    assert err(out_smooth) < 0.6 * err(out_plain), (err(out_smooth), err(out_plain))
    # the smoothing vector is state (a weight reload copies it) and the fp32 copy is unsmoothed
    assert "smooth" in smoothed.state_dict()
    assert model[0] is linear  # record_input_ranges put the layer back


def test_smoothing_factors_balance_the_peaks():
    weight = torch.tensor([[1.0, -0.5, 0.25], [0.5, 0.5, -0.1]])  # column peaks 1, 0.5, 0.25
    x_peak = torch.tensor([16.0, 1.0, 0.0])  # the last channel never fired in calibration
    s = smoothing_factors(x_peak, weight, alpha=0.5)
    torch.testing.assert_close(s[:2], torch.tensor([4.0, 2.0 ** 0.5]))
    # after smoothing both sides of a channel peak at the same value
    torch.testing.assert_close(x_peak[:2] / s[:2], weight.abs().amax(0)[:2] * s[:2])
    assert torch.isfinite(s).all() and (s > 0).all()


def _with_outlier_rows(m: int, k: int, rows: list[int], seed: int = 4):
    """[m, k] tokens, and the [m] mask of `rows`: those peak at over 22x their root mean square
    (over Int8Linear's ratio of 20: the residual pass), the others under 6x. A peak can be at
    most sqrt(k) times the rms, so k must be over 484."""
    torch.manual_seed(seed)
    x = torch.randn(m, k)  # peak / rms ~ 3: one pass
    outliers = torch.zeros(m, dtype=torch.bool)
    outliers[rows] = True
    x[outliers] = torch.randn(len(rows), k) * 0.05
    x[outliers, 5] = 60.0  # peak / rms ~ 24 at k = 600
    ratio = x.abs().amax(1) / x.pow(2).mean(1).sqrt()
    assert (ratio[outliers] > 22).all() and (ratio[~outliers] < 6).all()  # far from 20
    return x, outliers


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
@pytest.mark.parametrize("path", C_PATHS)
def test_outlier_tokens_get_a_residual_pass(path):
    """A token whose peak is over 20x its root mean square (in MiniLM: [CLS]/[SEP] rows of
    the FFN-down input) spends its codes on one channel; the kernel adds a second pass over its
    rounding residual."""
    m, k, n = 30, 600, 70
    linear = _linear(k, n)
    x, outliers = _with_outlier_rows(m, k, [0, 13, 29])
    ratio = x.abs().amax(1) / x.pow(2).mean(1).sqrt()
    layer = Int8Linear.from_linear(linear, path)
    lib = int8_cpu.int8_kernels(path)
    with torch.inference_mode():
        out = layer(x)
        ref = linear(x)
    torch.testing.assert_close(out, _scheme_reference(layer, x, lib.levels, outliers),
                               rtol=1e-5, atol=1e-5)
    plain = _scheme_reference(layer, x, lib.levels)  # without the residual pass
    err = lambda y: (y - ref).norm(dim=1) / ref.norm(dim=1)  # noqa: E731
    assert (err(out)[outliers] < 0.2 * err(plain)[outliers]).all()
    # the ratio is the layer's: at 30 none of these rows qualifies, at 2 every row does
    assert (ratio > 2.5).all()
    with torch.inference_mode():
        layer.outlier_ratio = 30.0
        torch.testing.assert_close(layer(x), plain, rtol=1e-5, atol=1e-5)
        layer.outlier_ratio = 2.0
        torch.testing.assert_close(
            layer(x), _scheme_reference(layer, x, lib.levels, torch.ones(m, dtype=torch.bool)),
            rtol=1e-5, atol=1e-5)


def test_avx2_qkv_takes_a_lower_outlier_ratio():
    """quantize_linears gives a layer the ratio OUTLIER_RATIOS names for its path and name
    (the AVX2 build's QKV: 10), every other layer Int8Linear's 20."""
    from pooler.layers.quantization import OUTLIER_RATIOS, quantize_linears

    model = nn.ModuleDict({"qkv_proj": _linear(16, 48), "up_proj": _linear(16, 32)})
    quantize_linears(model, keep_fp32=())
    path = model["qkv_proj"].path
    assert model["qkv_proj"].outlier_ratio == OUTLIER_RATIOS.get(path, {}).get("qkv_proj", 20.0)
    assert model["up_proj"].outlier_ratio == 20.0
    assert OUTLIER_RATIOS["avx2"] == {"qkv_proj": 10.0, "Wqkv": 10.0}


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here (needs Linux x86-64 with "
                    "AVX2+FMA or AVX-512 VNNI)")
@pytest.mark.parametrize("path", C_PATHS)
def test_bf16_output_is_the_fp32_output_rounded(path):
    """bf16_out stores exactly what the fp32 epilogue computes, rounded to nearest even: full
    and partial panels (114 columns), with an activation, a residual, and outlier rows (their
    combine step rounds too)."""
    layer = Int8Linear.from_linear(_linear(600, 114), path)
    x, _ = _with_outlier_rows(40, 600, [5, 39])  # two rows take the residual pass
    residual = torch.randn(40, 114)
    with torch.inference_mode():
        for act, res in ((0, None), (int8_cpu.ACT_GELU_ERF, None), (0, residual)):
            full = layer.fused_forward(x, act, res)
            half = layer.fused_forward(x, act, res, bf16_out=True)
            assert half.dtype == torch.bfloat16 and half.shape == full.shape
            assert torch.equal(half, full.to(torch.bfloat16))


def _norm(n: int, seed: int = 4) -> nn.LayerNorm:
    torch.manual_seed(seed)
    norm = nn.LayerNorm(n, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
@pytest.mark.parametrize("path", C_PATHS)
@pytest.mark.parametrize("m,n", [(1, 50), (37, 114), (301, 384)])
def test_fused_layernorm_is_the_norm_of_the_output(path, m, n):
    """norm= applies the LayerNorm in the kernel (int8_gemm.c's norm_rows, per row block): it
    matches torch's LayerNorm run on the unfused output, on widths with a vector tail (50, 114)
    and a partial panel, with outlier rows (normalized after their residual pass), and does not
    depend on the thread count."""
    layer, norm = Int8Linear.from_linear(_linear(600, n), path), _norm(n)
    x, _ = _with_outlier_rows(m, 600, [m // 2])
    residual = torch.randn(m, n)
    with torch.inference_mode():
        expected = norm(layer.fused_forward(x, 0, residual))
        outs = _per_thread_count(lambda: layer.fused_forward(x, 0, residual, norm=norm))
    torch.testing.assert_close(outs[0], expected, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
def test_norms_the_kernel_cannot_apply_fall_back_to_torch():
    """fused_forward returns None for a norm it does not take (the wrong width, no affine
    parameters, an RMSNorm, a bf16 output), and linear_add_norm then runs the norm after the
    add; a plain nn.Linear always takes that path."""
    from pooler.layers.linear import linear_add_norm
    from pooler.layers.quantization import fused_norm_args

    linear = _linear(40, 48)
    layer = Int8Linear.from_linear(linear, C_PATHS[0])
    x, residual = torch.randn(5, 40), torch.randn(5, 48)
    rms = nn.RMSNorm(48)
    for norm in (_norm(40), nn.LayerNorm(48, elementwise_affine=False), rms):
        assert fused_norm_args(norm, 48) is None
    with torch.inference_mode():
        assert layer.fused_forward(x, 0, residual, bf16_out=True, norm=_norm(48)) is None
        torch.testing.assert_close(linear_add_norm(layer, x, residual, rms),
                                   rms(layer.fused_forward(x, 0, residual)))
        norm = _norm(48)
        torch.testing.assert_close(linear_add_norm(linear, x, residual, norm),
                                   norm(linear(x) + residual), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear_add_norm(layer, x, residual, norm),
                                   norm(layer.fused_forward(x, 0, residual)), rtol=1e-5,
                                   atol=1e-5)


def _post_norm_models():
    """A tiny BERT and a tiny GTE (a post-norm rotary encoder), seeded, LayerNorms made to
    matter."""
    from pooler.models.gte import GteModel
    from tests.unit.bert_stack import tiny_bert

    torch.manual_seed(5)
    gte = GteModel({"vocab_size": 100, "hidden_size": 48, "intermediate_size": 80,
                    "num_hidden_layers": 2, "num_attention_heads": 3}).eval()
    with torch.no_grad():
        for name, p in gte.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
    return {"bert": tiny_bert(), "gte": gte}


@pytest.mark.skipif(not C_PATHS, reason="no int8 C build runs here")
@pytest.mark.parametrize("family", ["bert", "gte"])
def test_post_norm_layers_norm_in_the_int8_kernel(family, monkeypatch):
    """BERT's and the rotary encoders' post-norm blocks hand their add-and-norm to the int8
    kernel (two norms per layer), and the model's output matches the norms run in torch."""
    from pooler.layers import quantization
    from tests.unit.bert_stack import packed_inputs

    model = _post_norm_models()[family]
    quantization.quantize_linears(model, keep_fp32=())
    for module in model.modules():  # as apply_quantization sets it: attention's output is fp32
        if hasattr(module, "attention_bf16_products"):
            module.attention_bf16_products = True
    inputs = packed_inputs([60, 37, 100])
    fused_norms = []
    forward = Int8Linear.fused_forward

    def spy(self, *args, norm=None, **kwargs):
        y = forward(self, *args, norm=norm, **kwargs)
        fused_norms.append(norm is not None and y is not None)
        return y

    monkeypatch.setattr(Int8Linear, "fused_forward", spy)
    with torch.inference_mode():
        fused = model(inputs)
        assert sum(fused_norms) == 2 * len(model.layers)
        monkeypatch.setattr(quantization, "FUSED_NORM", False)
        fused_norms.clear()
        plain = model(inputs)
        assert not any(fused_norms)
    # the two differ by float rounding in the norm, which can move an int8 code downstream
    cos = torch.nn.functional.cosine_similarity(fused, plain, dim=1)
    assert cos.min() > 0.9999, cos.min()
