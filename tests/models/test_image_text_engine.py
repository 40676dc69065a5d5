"""Engine.embed / Engine.score with images and texts on CLIP, SigLIP and SigLIP2 (tiny seeded
folders), against transformers; the scheduler's charge for images; errors."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from pooler.engine.llm import Engine
from tests.models.image_text_folders import save_tiny_clip, save_tiny_siglip

transformers = pytest.importorskip("transformers")

TEXTS = ["a photo of a cat", "dog", "the red car under the big tree"]


def _images(n=3, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [(32, 32), (50, 20), (17, 61), (64, 48), (40, 40)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for w, h in sizes[:n]]


def _unit(x: torch.Tensor) -> np.ndarray:
    return (x / x.norm(dim=-1, keepdim=True)).numpy()


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    folder = save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip")
    return folder, Engine(str(folder), device="cpu"), transformers.CLIPModel.from_pretrained(
        folder).eval()


@pytest.fixture(scope="module", params=[1, 2])
def siglip(request, tmp_path_factory):
    folder = save_tiny_siglip(tmp_path_factory.mktemp("siglip") / "s", version=request.param)
    cls = transformers.SiglipModel if request.param == 1 else transformers.Siglip2Model
    return request.param, folder, Engine(str(folder), device="cpu"), \
        cls.from_pretrained(folder).eval()


@torch.inference_mode()
def test_clip_mixed_batch_matches_transformers(clip):
    folder, engine, ref = clip
    processor = transformers.CLIPProcessor.from_pretrained(folder)
    images = _images()
    inputs = [TEXTS[0], images[0], TEXTS[1], images[1], images[2], TEXTS[2]]
    out = np.stack([o.embedding for o in engine.embed(inputs)])
    want_img = _unit(ref.get_image_features(
        **processor(images=images, return_tensors="pt")).pooler_output)
    want_txt = _unit(torch.cat([ref.get_text_features(
        **processor.tokenizer([t], return_tensors="pt")).pooler_output for t in TEXTS]))
    want = np.stack([want_txt[0], want_img[0], want_txt[1], want_img[1], want_img[2],
                     want_txt[2]])
    assert np.abs(out - want).max() <= 1e-5
    # one image alone, raw (normalize=False): transformers' unnormalized features
    alone = engine.embed([images[1]], normalize=False)[0].embedding
    raw = ref.get_image_features(**processor(images=images[1:2], return_tensors="pt"))
    assert np.abs(alone - raw.pooler_output[0].numpy()).max() <= 1e-5
    assert engine.embedding_size == 24


@torch.inference_mode()
def test_siglip_text_and_images_match_transformers(siglip):
    version, folder, engine, ref = siglip
    # the reference processor: max_length padding with a mask (right for SigLIP's tokenizer,
    # left for SigLIP2's, which also lowercases)
    side = "right" if version == 1 else "left"
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder, padding_side=side)
    batch = tokenizer(TEXTS, padding="max_length", max_length=12, truncation=True,
                      return_tensors="pt")
    want_txt = _unit(ref.get_text_features(**batch).pooler_output)
    texts = TEXTS if version == 1 else [t.upper() for t in TEXTS]
    images = _images()
    image_processor = transformers.AutoImageProcessor.from_pretrained(folder)
    kwargs = {"do_convert_rgb": True} if version == 2 else {}
    want_img = _unit(ref.get_image_features(
        **image_processor(images=images, return_tensors="pt", **kwargs)).pooler_output)
    out = engine.embed([images[0], texts[0], images[1], texts[1], texts[2], images[2]])
    got = np.stack([o.embedding for o in out])
    want = np.stack([want_img[0], want_txt[0], want_img[1], want_txt[1], want_txt[2],
                     want_img[2]])
    assert np.abs(got - want).max() <= 1e-5
    if version == 1:
        assert out[1].num_tokens == 12  # every text runs padded to the tower's length
        assert out[0].num_tokens == 16  # 4 x 4 patches, no class token


@torch.inference_mode()
def test_score_is_raw_cosine_of_both_towers(clip):
    folder, engine, ref = clip
    images = _images(2)
    e_text, e_img0, e_img1 = (o.embedding for o in engine.embed([TEXTS[0], *images]))
    scores = engine.score(TEXTS[0], images)
    assert [s.document_index for s in scores] == [0, 1]
    assert scores[0].score == pytest.approx(float(e_text @ e_img0), abs=1e-6)
    assert scores[1].score == pytest.approx(float(e_text @ e_img1), abs=1e-6)
    image_image = engine.score([images[0]], [images[1]])
    assert image_image[0].score == pytest.approx(float(e_img0 @ e_img1), abs=1e-6)
    assert engine.score(images[0], TEXTS[0])[0].score == pytest.approx(scores[0].score,
                                                                       abs=1e-6)


def test_forms_of_one_image_share_one_embedding_and_cache_entry(clip, tmp_path):
    _, engine, _ = clip
    image = _images(1, seed=5)[0]
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    path = tmp_path / "x.png"
    path.write_bytes(buffer.getvalue())
    before = engine.image_cache_stats()["encoder"]
    out = engine.embed([image, buffer.getvalue(), path, {"image": str(path)},
                        {"prompt": "", "multi_modal_data": {"image": image}}])
    assert all(np.array_equal(o.embedding, out[0].embedding) for o in out)
    after = engine.image_cache_stats()["encoder"]
    assert after.misses - before.misses == 1 and after.entries - before.entries == 1


def test_images_charge_their_patches_against_the_step_budget(tmp_path):
    folder = save_tiny_clip(tmp_path / "clip")
    engine = Engine(str(folder), device="cpu", max_num_batched_tokens=40)
    steps = []
    schedule = engine.core.scheduler.schedule

    def recording():
        out = schedule()
        if out.scheduled_new_reqs:
            steps.append((out.total_num_scheduled_tokens, len(out.scheduled_new_reqs)))
        return out
    engine.core.scheduler.schedule = recording
    out = engine.embed(_images(5))
    assert [o.num_tokens for o in out] == [17] * 5  # 16 patches + the class token
    assert all(tokens <= 40 for tokens, _ in steps)
    assert max(n for _, n in steps) == 2 and sum(n for _, n in steps) == 5


def test_images_to_a_text_model_fail_with_one_clear_error(tmp_path, minilm_path):
    from tests.models.tiny import save_tiny_bert
    engine = Engine(str(save_tiny_bert(tmp_path / "bert", minilm_path)), device="cpu")
    with pytest.raises(ValueError, match=r"inputs\[1\] is an image, but BertModel is a "
                                         r"text-only model"):
        engine.embed(["text", _images(1)[0]])
    with pytest.raises(ValueError, match=r"documents\[0\] is an image"):
        engine.score("text", [_images(1)[0]])


def test_bad_image_and_unsupported_options_name_the_fix(clip):
    _, engine, _ = clip
    with pytest.raises(ValueError, match=r"inputs\[1\] is not an image"):
        engine.embed(["a cat", b"plain bytes, not a picture"])
    with pytest.raises(ValueError, match="prompt='x: ' is not supported for image-text"):
        engine.embed(["a cat"], prompt="x: ")


def test_background_loop_admits_images_by_their_patches(clip):
    from pooler.engine.engine_loop import CallContext, current_call
    _, engine, _ = clip
    admitted = []
    engine.start_background_loop()
    try:
        token = current_call.set(CallContext(admit=admitted.append))
        try:
            out = engine.embed([_images(1)[0], "dog"])
        finally:
            current_call.reset(token)
    finally:
        engine.shutdown()
    assert admitted == [17 + 3] and [o.num_tokens for o in out] == [17, 3]


def test_encode_with_embed_params_takes_images_and_pads_like_embed(siglip):
    from pooler.params import PoolingParams
    _, _, engine, _ = siglip
    inputs = ["dog", _images(1)[0]]
    want = [o.embedding for o in engine.embed(inputs)]
    got = engine.encode(inputs, PoolingParams(task="embed"))
    assert all(np.allclose(g.data, w, atol=1e-6) for g, w in zip(got, want))


def test_sentence_transformers_clip_folder_matches_sentence_transformers(tmp_path):
    """sentence-transformers' CLIP layout (modules.json -> 0_CLIPModel/): the same raw,
    unnormalized vectors as SentenceTransformer.encode, and its cosine similarity."""
    import json
    st = pytest.importorskip("sentence_transformers")
    root = tmp_path / "st-clip"
    save_tiny_clip(root / "0_CLIPModel")
    (root / "modules.json").write_text(json.dumps([{
        "idx": 0, "name": "0", "path": "0_CLIPModel",
        "type": "sentence_transformers.models.CLIPModel"}]))
    reference = st.SentenceTransformer(str(root), device="cpu")
    images = _images()
    want = np.concatenate([reference.encode(images), reference.encode(TEXTS)])  # one modality a call
    engine = Engine(str(root), device="cpu")
    got = np.stack([o.embedding for o in engine.embed(images + TEXTS)])
    assert np.abs(got - want).max() <= 1e-5
    score = engine.score(TEXTS[0], [images[0]])[0].score
    assert score == pytest.approx(float(reference.similarity(want[3:4], want[:1])), abs=1e-6)


@torch.inference_mode()
def test_clip_legacy_eos_config_pools_where_transformers_does(tmp_path):
    folder = save_tiny_clip(tmp_path / "legacy", legacy_eos=True)
    ref = transformers.CLIPModel.from_pretrained(folder).eval()
    tokenizer = transformers.CLIPProcessor.from_pretrained(folder).tokenizer
    engine = Engine(str(folder), device="cpu")
    got = np.stack([o.embedding for o in engine.embed(TEXTS, normalize=False)])
    want = torch.cat([ref.get_text_features(**tokenizer([t], return_tensors="pt")).pooler_output
                      for t in TEXTS]).numpy()
    assert np.abs(got - want).max() <= 1e-5


def test_dimensions_and_normalize_apply_to_images_as_to_texts(clip):
    _, engine, _ = clip
    image = _images(1)[0]
    full = engine.embed([image], normalize=False)[0].embedding
    cut = engine.embed([image], dimensions=8)[0].embedding
    assert cut.shape == (8,)
    assert np.allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    with pytest.raises(ValueError, match="dimensions=99 is larger"):
        engine.embed([image], dimensions=99)
