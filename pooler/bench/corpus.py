"""Deterministic benchmark inputs: the same texts on every machine and every run."""
from __future__ import annotations

import random

# Common English words: real WordPiece behaviour (mostly whole-word tokens, some splits).
_WORDS = """
the of and to in is was for on that with as by at from his her it an are were be this which
or have has had not but one all their they there been new first also more after who would
two time other when its into some only them about than most can over years made people may
such many these where between during three both under world used city state while later
school part since number well through being until water system name back known each music
however because high work group life family day game second before long around house public
season early team best found against called several four government area make both another
river small large series album national history market company place data report model
language question answer search engine server request query document passage vector memory
network energy light sound story paper table window garden morning evening summer winter
doctor student teacher children mother father friend country village mountain island ocean
forest animal bird horse dog cat fish tree flower stone road bridge train ship plane car
computer program software library function value result method process change problem field
simple quick brown lazy fox jumps bright dark warm cold green blue red white black yellow
strong weak happy quiet loud careful recent ancient modern famous common rare useful
explain describe compare measure build improve reduce increase follow create design remember
understand consider develop provide support include continue produce receive protect prepare
""".split()


def _sentence(rng: random.Random, num_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(num_words)]
    # Break into sentences of 6-18 words so passages read like text, not one run-on line.
    out, i = [], 0
    while i < len(words):
        n = rng.randint(6, 18)
        chunk = words[i:i + n]
        chunk[0] = chunk[0].capitalize()
        out.append(" ".join(chunk) + rng.choice([".", ".", ".", "?", "!"]))
        i += n
    return " ".join(out)


def queries(n: int, seed: int = 0) -> list[str]:
    """n short queries of 5-15 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 15))) for _ in range(n)]


def passages(n: int, seed: int = 1) -> list[str]:
    """n passages of 50-250 words."""
    rng = random.Random(seed)
    return [_sentence(rng, rng.randint(50, 250)) for _ in range(n)]


def mixed_corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Half queries, half passages, interleaved in a fixed shuffled order (as a real job
    arrives: callers do not sort their inputs)."""
    texts = queries(n // 2, seed) + passages(n - n // 2, seed + 1)
    random.Random(seed + 2).shuffle(texts)
    return texts


def long_corpus(n: int = 600, seed: int = 0) -> list[str]:
    """n long passages of 100-250 words (about 130-330 tokens, so many reach a 256-token
    truncation): the sequence lengths where attention, norms and packing weigh most."""
    rng = random.Random(seed + 3)
    return [_sentence(rng, rng.randint(100, 250)) for _ in range(n)]


def long_mix(short: int = 300, long: int = 300, seed: int = 30) -> list[str]:
    """The mix issue 30 measured on: `short` texts of 5-15 words and `long` of 50-250 words
    (about 78 tokens a text on average, up to ~250), shuffled in a fixed order. The same
    recipe as mixed_corpus at that size, with its own seed."""
    texts = queries(short, seed) + passages(long, seed + 1)
    random.Random(seed + 2).shuffle(texts)
    return texts


# --corpus choices: mixed (mixed_corpus), long (long_mix, issue 30), passages (long_corpus)
CORPORA = ("mixed", "long", "passages")
