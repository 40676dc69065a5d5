"""pooler's ColModernVBert (pooler/models/colmodernvbert.py + pooler/pooling/colvision.py, fed by
pooler/multimodal/colmodernvbert_inputs.py) equals transformers' ColModernVBertForRetrieval fed
by ColModernVBertProcessor: multi-vectors (masked to valid tokens) and MaxSim scores, queries
and page images, alone and in mixed batches (tiny seeded folders)."""
from __future__ import annotations

import pytest
import torch

from pooler.models.colmodernvbert import pixel_shuffle
from pooler.models.inputs import ModelInputs
from tests.models.colmodernvbert_folders import IMAGE_SEQ_LEN, TILE, NativeColModernVBert as Ours, \
    page_image, save_tiny_colmodernvbert

transformers = pytest.importorskip("transformers")

QUERIES = ["which page shows the revenue chart", "fox", "the lazy dog and a quarterly report"]
# (height, width): wide (2 x 3 tiles), tiny square (3 x 3), tall (3 x 1), near-square (3 x 3)
PAGES = [(60, 90), (20, 20), (100, 30), (97, 95)]
TOL = 1e-4


def _masked(embeddings: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [e[m.bool()] for e, m in zip(embeddings, mask)]


def _maxsim64(queries: list[torch.Tensor], docs: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([[float((q.double() @ d.double().T).max(dim=1).values.sum())
                          for d in docs] for q in queries], dtype=torch.float64)


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


@pytest.fixture(scope="module")
def split_folder(tmp_path_factory):
    return save_tiny_colmodernvbert(tmp_path_factory.mktemp("colmodernvbert"))


@pytest.fixture(scope="module")
def reference(split_folder):
    model = transformers.ColModernVBertForRetrieval.from_pretrained(split_folder).eval()
    processor = transformers.ColModernVBertProcessor.from_pretrained(split_folder)
    return model, processor


@pytest.fixture(scope="module")
def ours(split_folder):
    return Ours(split_folder)


@torch.inference_mode()
def _reference_queries(reference, queries):
    model, processor = reference
    batch = processor.process_queries(queries)
    return _masked(model(**batch).embeddings, batch["attention_mask"]), batch


@torch.inference_mode()
def _reference_pages(reference, images):
    model, processor = reference
    batch = processor.process_images(images)
    return _masked(model(**batch).embeddings, batch["attention_mask"]), batch


def test_pixel_shuffle_groups_neighbouring_patches():
    # 4 x 4 patches of 1 channel numbered row-major; f=2 -> 4 vectors of the 2 x 2 blocks
    x = torch.arange(16.0).view(1, 16, 1)
    out = pixel_shuffle(x, 2)
    assert out.shape == (1, 4, 4)
    assert out[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]


def test_queries_match_reference(reference, ours):
    want, batch = _reference_queries(reference, QUERIES)
    for q, ids, mask in zip(QUERIES, batch["input_ids"], batch["attention_mask"]):
        assert ours.query_ids(q) == ids[mask.bool()].tolist()
    got, _ = ours.run(QUERIES, [])
    assert _close(got, want) <= TOL
    got_one, _ = ours.run(QUERIES[1:2], [])  # alone equals in a batch
    assert _close(got_one, want[1:2]) <= TOL


@pytest.mark.parametrize("size", PAGES)
def test_single_page_matches_reference(reference, ours, size):
    image = page_image(*size, seed=sum(size))
    want, batch = _reference_pages(reference, [image])
    got, ids = ours.run([], [image])
    assert ids[0] == batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert sum(i == ours.model.image_token_id for i in ids[0]) % IMAGE_SEQ_LEN == 0
    assert _close(got, want) <= TOL


def test_mixed_batch_and_maxsim_match_reference(reference, ours):
    _, processor = reference
    images = [page_image(*size, seed=i) for i, size in enumerate(PAGES[:3])]
    want_docs, batch = _reference_pages(reference, images)
    # pages of different tile counts: the reference pads tiles and tokens, we pack
    assert batch["pixel_values"].shape[1] == 10
    assert batch["attention_mask"].sum(1).unique().numel() == 3
    want_queries, _ = _reference_queries(reference, QUERIES)
    for one_vision_call in (True, False):
        got, _ = ours.run(QUERIES, images, one_vision_call)  # queries and pages in one step
        got_queries, got_docs = got[:len(QUERIES)], got[len(QUERIES):]
        assert _close(got_docs, want_docs) <= TOL
        assert _close(got_queries, want_queries) <= TOL
    # per page: score_retrieval zero-pads pages of different lengths (a padded 0 can win the max)
    scores_ref = torch.cat([processor.score_retrieval(want_queries, [d]) for d in want_docs],
                           dim=1).double()
    scores_ours = _maxsim64(got_queries, got_docs)
    assert (scores_ours - scores_ref).abs().max() <= TOL
    assert (scores_ours - _maxsim64(want_queries, want_docs)).abs().max() <= TOL


def test_unsplit_pages_match_reference(tmp_path):
    """longest_edge = one tile: every page is one global image (no row/col tiles)."""
    folder = save_tiny_colmodernvbert(tmp_path / "unsplit", longest_edge=TILE, seed=1)
    model = transformers.ColModernVBertForRetrieval.from_pretrained(folder).eval()
    processor = transformers.ColModernVBertProcessor.from_pretrained(folder)
    ours = Ours(folder)
    images = [page_image(50, 20, 1), page_image(31, 64, 2)]
    want, _ = _reference_pages((model, processor), images)
    got, ids = ours.run(["fox"], images)
    assert all(sum(i == ours.model.image_token_id for i in x) == IMAGE_SEQ_LEN for x in ids[1:])
    assert _close(got[1:], want) <= TOL


def test_placeholder_count_mismatch_is_a_clear_error(ours):
    ids = ours.query_ids("fox")
    inputs = ModelInputs(input_ids=torch.tensor(ids), positions=torch.arange(len(ids)),
                         token_type_ids=None, cu_seqlens=torch.tensor([0, len(ids)],
                                                                      dtype=torch.int32),
                         seq_lens=[len(ids)], max_seqlen=len(ids))
    with pytest.raises(ValueError, match="image placeholder tokens"):
        ours.model(inputs, image_embeds=torch.zeros(IMAGE_SEQ_LEN, ours.model.hidden_size))
    with pytest.raises(ValueError, match="tiles"):
        ours.model.image_features(torch.zeros(1, 3, TILE + 4, TILE))


def test_mismatched_processor_is_refused(ours):
    with pytest.raises(ValueError, match="image_seq_len"):
        ours.prompts.check_model(ours.model.tile_side, ours.model.image_seq_len * 4)
    with pytest.raises(ValueError, match="image_token_id"):
        ours.prompts.check_tokenizer(ours.tokenizer, ours.model.image_token_id + 1)


def test_original_layout_reads_as_the_same_model(split_folder, reference, tmp_path):
    """The original ModernVBERT names and config keys (as vLLM's loader reads them) give the
    transformers model's vectors."""
    from tests.models.colmodernvbert_folders import save_original_layout

    original = Ours(save_original_layout(split_folder, tmp_path / "original"))
    images = [page_image(60, 90, 0), page_image(20, 20, 1)]
    want_docs, _ = _reference_pages(reference, images)
    want_queries, _ = _reference_queries(reference, QUERIES[:1])
    got, _ = original.run(QUERIES[:1], images)
    assert _close(got, want_queries + want_docs) <= TOL


def test_loader_fills_backbone_and_head(split_folder, ours):
    """pooler's loader (prefix stripping, backbone then pooler weights) on the model and the
    ColVision head, as the engine will build them: the same weights as the composed model."""
    import json
    from types import SimpleNamespace

    from pooler.loader import PoolingModel, load_weights_into
    from pooler.models.colmodernvbert import ColModernVBertModel
    from pooler.pooling.colvision import build_colvision_poolers
    from pooler.pooling.dispatch import DispatchPooler

    backbone = ColModernVBertModel(json.loads((split_folder / "config.json").read_text()))
    model = PoolingModel(backbone, DispatchPooler(build_colvision_poolers(None, backbone)))
    load_weights_into(model, SimpleNamespace(gliner=None, path=split_folder))
    assert model.pooler.output_size("token_embed") == 16
    want = dict(ours.model.named_parameters())
    for name, param in backbone.named_parameters():
        assert torch.equal(param, want[name]), name
    head = model.pooler.poolers["token_embed"].projector
    assert torch.equal(head.weight, ours.head.projector.weight)
    assert torch.equal(head.bias, ours.head.projector.bias)


def test_prompts_from_older_folder_layout(tmp_path):
    """transformers < 5 keeps the image settings in preprocessor_config.json; no settings at all
    is a clear error."""
    import json

    from pooler.multimodal.colmodernvbert_inputs import ColModernVBertPrompts

    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    with pytest.raises(ValueError, match="no image processor settings"):
        ColModernVBertPrompts.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}))
    prompts = ColModernVBertPrompts.from_folder(tmp_path)
    assert (prompts.image_config.tile_side, prompts.image_config.longest_edge) == (512, 2048)
    assert prompts.image_seq_len == 64 and prompts.visual_prompt_prefix.count("<image>") == 1
    assert prompts.query_text("q") == "q" + "<end_of_utterance>" * 10
