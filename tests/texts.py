"""Deterministic varied texts for parity tests."""
import random

_WORDS = ("the a search engine retrieval vector model query passage document token embedding "
          "fast slow cat dog river mountain Paris Tokyo 2024 user data privacy neural network "
          "läuft über café naïve 東京 北京 Москва emoji 🙂 C++ e-mail x@y.com $100 50% "
          "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis").split()


def varied_texts(n: int, seed: int = 0) -> list[str]:
    """Short, long (beyond 256 tokens, so truncated), unicode and empty texts."""
    rng = random.Random(seed)
    texts = ["", " ", "a", "Hello world!", "日本語のテキスト", "🙂🙂🙂"]
    while len(texts) < n:
        kind = rng.random()
        length = rng.randint(1, 12) if kind < 0.5 else rng.randint(40, 120) if kind < 0.85 \
            else rng.randint(250, 400)
        texts.append(" ".join(rng.choice(_WORDS) for _ in range(length)))
    return texts[:n]
