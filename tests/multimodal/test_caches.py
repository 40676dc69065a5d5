"""The multimodal input cache and the encoder cache: bounded in bytes, counted, and each reset
clears its own cache and leaves the other (and late-interaction state) alone."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pooler.multimodal.cache import ByteLRUCache
from tests.models.image_text_folders import save_tiny_clip


def test_byte_bound_lru_and_counters():
    cache = ByteLRUCache(100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3, 40)       # over 100 bytes: evicts b, the least recent
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.get("b") is None
    cache.put("huge", 4, 101)   # larger than the whole cache: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 2
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.entries, stats.bytes) == \
        (3, 1, 1, 2, 80)
    cache.clear()
    assert len(cache) == 0 and cache.stats().bytes == 0 and cache.stats().hits == 3


def _image(seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))


@pytest.fixture()
def engine(tmp_path):
    from pooler.engine.llm import Engine
    folder = save_tiny_clip(tmp_path / "clip")
    return Engine(str(folder), device="cpu")


def _entries(engine):
    stats = engine.image_cache_stats()
    return stats["mm"].entries, stats["encoder"].entries


class _Calls:
    def __init__(self, monkeypatch, obj, name):
        self.count = 0
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(obj, name, wrapper)


def test_each_reset_clears_its_cache_only(engine, monkeypatch):
    clear = _Calls(monkeypatch, engine.core.model_runner.pooling_runner, "clear")
    first = engine.embed([_image(0), _image(1)])
    assert _entries(engine) == (2, 2)
    engine.embed([_image(0)])  # served by both caches
    stats = engine.image_cache_stats()
    assert (stats["mm"].hits, stats["encoder"].hits) == (1, 1)

    engine.reset_mm_cache()  # preprocessed pixels only
    assert _entries(engine) == (0, 2) and clear.count == 0
    again = engine.embed([_image(0)])
    stats = engine.image_cache_stats()
    assert stats["mm"].misses == 3 and stats["encoder"].hits == 2
    assert np.array_equal(again[0].embedding, first[0].embedding)

    engine.reset_encoder_cache()  # vision outputs, with the late-interaction state
    assert _entries(engine) == (1, 0) and clear.count == 1


def test_reload_weights_clears_both_and_serves_the_new_weights(engine):
    image = _image(3)
    before = engine.embed([image])[0].embedding
    save_tiny_clip(engine.model_config.path, seed=7)  # a fine-tune wrote new weights
    engine.reload_weights()
    assert _entries(engine) == (0, 0)
    after = engine.embed([image])[0].embedding
    assert not np.allclose(before, after)


def test_encoder_cache_is_bounded(engine):
    runner = engine.core.model_runner.image_runner
    runner.cache.capacity_bytes = 2 * 24 * 4  # two 24-float embeddings
    engine.embed([_image(s) for s in range(4)])
    stats = engine.image_cache_stats()["encoder"]
    assert stats.entries == 2 and stats.bytes <= 2 * 24 * 4 and stats.evictions == 2
