"""A least-recently-used cache bounded in bytes, with counters a metrics page can read.

Used twice (docs/architecture.md): the multimodal input cache (preprocessed pixels by image
content hash, on the input side) and the encoder cache (vision-tower outputs by content hash,
in the model runner). Thread-safe: callers' threads read the input cache while the engine loop
steps.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None


class ByteLRUCache:
    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError(f"a cache size must be >= 0 bytes, got {capacity_bytes}.")
        self.capacity_bytes = int(capacity_bytes)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep `value`; an entry larger than the whole cache is not kept."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self.capacity_bytes:
                return
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.capacity_bytes:
                _, (_, size) = self._entries.popitem(last=False)
                self._bytes -= size
                self._evictions += 1

    def clear(self) -> None:
        """Drop every entry; the counters keep counting (they are totals since start)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries),
                              self._bytes, self.capacity_bytes)
