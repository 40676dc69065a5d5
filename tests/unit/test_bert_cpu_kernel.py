"""The C layer stack for one short sequence (pooler/kernels/encoder_cpu.c) against BertModel's
torch layers, on seeded random BERTs whose sizes hit the kernel's edges: partial 32-column
panels, more rows than one 12-row tile, each activation it fuses."""
from __future__ import annotations

import pytest
import torch

from pooler.kernels import bert_cpu
from pooler.kernels.build import encoder_kernels
from pooler.layers.quantization import quantize_linears
from pooler.models.mpnet import MPNetModel
from tests.unit.bert_stack import packed_inputs as _inputs
from tests.unit.bert_stack import tiny_bert as _model
from tests.unit.bert_stack import torch_layers as _torch_layers

pytestmark = pytest.mark.skipif(
    encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_matches_torch_layers(act):
    model = _model(act)
    with torch.inference_mode():
        for length in (1, 5, 12, 13, 25, bert_cpu.MAX_TOKENS):
            inputs = _inputs([length])
            fused = bert_cpu.bert_layers_on_cpu(model, model.embed(inputs), inputs)
            assert fused is not None, f"{length} tokens should take the C path"
            torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5,
                                       atol=2e-5)


@pytest.mark.parametrize("lengths,unattended", [([4, 6], None), ([12, 12, 3], None),
                                                ([7], [2]), ([9, 5], [0, 3])])
def test_packed_sequences_and_unattended_suffixes_match_torch_layers(lengths, unattended):
    model, inputs = _model(), _inputs(lengths)
    inputs.num_unattended = unattended
    with torch.inference_mode():
        fused = bert_cpu.bert_layers_on_cpu(model, model.embed(inputs), inputs)
        assert fused is not None
        torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("lengths", [[12], [5, 16, 9]])
def test_mpnet_relative_position_bias_matches_torch_layers(lengths):
    torch.manual_seed(0)
    model = MPNetModel({"vocab_size": 100, "hidden_size": 48, "num_hidden_layers": 2,
                        "num_attention_heads": 3, "intermediate_size": 80}).eval()
    with torch.no_grad():  # the bias table starts near zero: make it matter
        model.relative_attention_bias.weight.normal_(0, 1.0)
    inputs = _inputs(lengths)
    with torch.inference_mode():
        bias = model.position_bias(inputs.seq_lens)
        x = model.embed_norm(model.word_embeddings(inputs.input_ids)
                             + model.position_embeddings(inputs.positions + 2))
        expected = x.clone()
        for layer in model.layers:
            expected = layer(expected, inputs, bias)
        fused = bert_cpu.bert_layers_on_cpu(model, x, inputs, bias)
        assert fused is not None
        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(model(inputs), expected, rtol=1e-5, atol=2e-5)


def test_a_sequence_gets_the_same_bits_alone_or_packed_with_others():
    model = _model()
    alone, packed = _inputs([11], seed=3), _inputs([5, 11, 8], seed=4)
    packed.input_ids[5:16] = alone.input_ids
    with torch.inference_mode():
        assert torch.equal(model(alone), model(packed)[5:16])


def test_forward_takes_it_and_results_do_not_depend_on_threads():
    model, inputs = _model(), _inputs([20])
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            one = model(inputs)
            torch.set_num_threads(2)
            two = model(inputs)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert bert_cpu._STATE in model.__dict__  # the forward went through the C path


def test_weight_reload_is_seen():
    model, inputs = _model(), _inputs([9])
    with torch.inference_mode():
        first = model(inputs)
        with torch.no_grad():
            model.layers[1].up_proj.weight.copy_(torch.randn_like(model.layers[1].up_proj.weight))
            model.layers[0].attn_norm.bias.add_(0.5)
        second = model(inputs)
        torch.testing.assert_close(second, _torch_layers(model, inputs), rtol=1e-5, atol=2e-5)
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("case", ["too long", "too many tokens in all", "nothing attended",
                                  "int8 layers", "silu", "autograd", "head size 8"])
def test_other_steps_keep_the_torch_path(case):
    model = _model("silu" if case == "silu" else "gelu", heads=6 if case == "head size 8" else 3)
    half = bert_cpu.MAX_TOKENS // 2 + 1
    inputs = _inputs({"too long": [bert_cpu.MAX_TOKENS + 1],
                      "too many tokens in all": [half, half]}.get(case, [7]))
    if case == "nothing attended":  # the torch path raises the error naming it
        inputs.num_unattended = [7]
    if case == "int8 layers":
        quantize_linears(model)
    grad = case == "autograd"
    with torch.set_grad_enabled(grad):
        x = model.embed(inputs)
        assert bert_cpu.bert_layers_on_cpu(model, x, inputs) is None


@pytest.fixture
def fresh_build(monkeypatch):
    """encoder_kernels() rebuilt under this test's environment, then back to the usual one."""
    from pooler.kernels import build

    build.encoder_kernels.cache_clear()
    yield build
    monkeypatch.undo()
    build.encoder_kernels.cache_clear()
    assert build.encoder_kernels() is not None


def test_switched_off_by_environment(fresh_build, monkeypatch):
    monkeypatch.setenv(fresh_build.DISABLE_ENV, "0")
    assert fresh_build.encoder_kernels() is None


@pytest.mark.parametrize("inter", [80, 88])
def test_the_avx2_build_matches_torch_layers(fresh_build, monkeypatch, inter):
    """The AVX2 build's panels are 16 columns wide: hidden sizes (multiples of 16) fill them, so
    an FFN of 88 (5.5 panels) is what gives its up and down GEMMs a partial panel."""
    if not fresh_build.cpu_features().avx2:
        pytest.skip("no AVX2 here")
    monkeypatch.setenv(fresh_build.DISABLE_ENV, "avx2")
    assert fresh_build.encoder_kernels().variant == "avx2"
    model = _model(inter=inter)
    with torch.inference_mode():
        for lengths, unattended in (([1], None), ([13], None), ([bert_cpu.MAX_TOKENS], None),
                                    ([4, 9], [0, 2])):
            inputs = _inputs(lengths)
            inputs.num_unattended = unattended
            fused = bert_cpu.bert_layers_on_cpu(model, model.embed(inputs), inputs)
            assert fused is not None
            torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5,
                                       atol=2e-5)


def test_builds_into_an_empty_cache_folder(fresh_build, monkeypatch, tmp_path):
    monkeypatch.setenv("POOLER_KERNEL_CACHE", str(tmp_path / "kernels"))
    lib = fresh_build.encoder_kernels()
    assert lib is not None
    built = list((tmp_path / "kernels").glob("encoder_cpu-*.so"))
    assert len(built) == 1 and lib._name == str(built[0])
    assert (tmp_path / "kernels").stat().st_mode & 0o077 == 0  # ours alone


def test_refuses_a_cache_folder_others_can_write(fresh_build, monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("POOLER_KERNEL_CACHE", str(shared))
    assert fresh_build.encoder_kernels() is None  # logged; the torch path runs
    assert not list(shared.iterdir())


def test_a_failed_build_falls_back(fresh_build, monkeypatch, tmp_path):
    monkeypatch.setenv("POOLER_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setattr(fresh_build.shutil, "which", lambda name: "/bin/false")
    assert fresh_build.encoder_kernels() is None
    assert not list(tmp_path.glob("*.so"))
