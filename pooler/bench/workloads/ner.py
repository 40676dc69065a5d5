"""NER workload: ../shared/models/ner-pii-minilm on texts full of names, emails, phones and
addresses. Peer: the transformers token-classification pipeline, aggregation_strategy="simple",
at the batch size that runs fastest for it here (swept on a sample)."""
from __future__ import annotations

import random
import time

from pooler.bench import corpus
from pooler.bench.common import (digest, flops_per_token, pooler_engine, pooler_sides,
                                 save_json, shared_model, shared_skip_reason, token_lens)
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

MODEL = "ner-pii-minilm"
_PIPELINE_BATCHES = (8, 32, 64)
_SWEEP_SAMPLE = 96

_GIVEN = "James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth Aisha Wei " \
         "Carlos Sofia Mohammed Olga Hiroshi Priya Lukas Fatima".split()
_SURNAMES = "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Nguyen " \
            "Kowalski Okafor Schmidt Tanaka Patel Rossi Dubois Andersson Haddad".split()
_STREETS = "Maple Oak Pine Cedar Elm Washington Lincoln Park Lake Hill Sunset Main".split()
_KINDS = "Street Avenue Road Boulevard Lane Drive Court".split()
_CITIES = [("Springfield", "IL"), ("Portland", "OR"), ("Austin", "TX"), ("Denver", "CO"),
           ("Madison", "WI"), ("Raleigh", "NC"), ("Tucson", "AZ"), ("Boston", "MA")]
_DOMAINS = "example.com mail.org inbox.net company.io school.edu".split()
_TEMPLATES = [
    "Please contact {name} at {email} or call {phone} before Friday.",
    "{name} moved to {address} last spring and asked us to update the records.",
    "Send the signed forms to {name}, {address}. Questions: {email}.",
    "Customer {name} (phone {phone}, email {email}) reported a billing problem.",
    "Hi team, {name} will join on Monday; her desk line is {phone}.",
    "Shipping label: {name}, {address}, tel. {phone}.",
    "Meeting notes: {name} and {name2} reviewed the contract. Follow up with {email}.",
]


def pii_texts(n: int, seed: int = 11) -> list[str]:
    """n short documents with PII in fixed seeded places, half padded with plain prose so the
    lengths mix (as a real log or ticket stream does)."""
    rng = random.Random(seed)

    def name():
        return f"{rng.choice(_GIVEN)} {rng.choice(_SURNAMES)}"

    texts = []
    for i in range(n):
        given, surname = rng.choice(_GIVEN), rng.choice(_SURNAMES)
        city, state = rng.choice(_CITIES)
        fields = dict(
            name=f"{given} {surname}", name2=name(),
            email=f"{given.lower()}.{surname.lower()}{rng.randint(1, 99)}@{rng.choice(_DOMAINS)}",
            phone=f"({rng.randint(200, 989)}) {rng.randint(200, 989)}-{rng.randint(0, 9999):04d}",
            address=f"{rng.randint(1, 9999)} {rng.choice(_STREETS)} {rng.choice(_KINDS)}, "
                    f"{city}, {state} {rng.randint(10000, 99999)}")
        text = rng.choice(_TEMPLATES).format(**fields)
        if i % 2:
            prose = corpus.passages(1, seed=seed * 1000 + i)[0][: rng.randint(100, 600)]
            text = prose.rsplit(" ", 1)[0].rstrip(".?!") + ". " + text
        texts.append(text)
    return texts


def _texts(opts: BenchOptions) -> list[str]:
    return pii_texts(16 if opts.quick else 500)


def _entities_digest(per_text: list[list[tuple]]) -> str:
    count = sum(len(e) for e in per_text)
    return f"{count} entities, digest {digest(per_text)}"


def _flops_per_token(opts: BenchOptions) -> float:
    path = shared_model(MODEL)
    return flops_per_token(path, token_lens(path, _texts(opts)))


def _pooler(quantization: str | None, side: str):
    def run(opts: BenchOptions) -> SideResult:
        path = shared_model(MODEL)
        texts = _texts(opts)
        engine = pooler_engine(path, opts, quantization)
        engine.ner(texts[:16], aggregation_strategy="simple", use_tqdm=False)  # warm up
        loaded = rss_mb()
        start = time.perf_counter()
        out = engine.ner(texts, aggregation_strategy="simple", use_tqdm=False)
        seconds = time.perf_counter() - start
        found = [[(e.entity_group, e.start, e.end) for e in ents] for ents in out]
        return SideResult(side, "pooler", len(texts), sum(token_lens(path, texts)), seconds,
                          loaded_rss_mb=loaded, note=_entities_digest(found),
                          outputs_file=save_json(opts, f"ner-{side}", found))
    return run


def _pipeline(opts: BenchOptions) -> SideResult:
    from transformers import pipeline

    path = shared_model(MODEL)
    texts = _texts(opts)
    device = 0 if opts.device == "cuda" else -1
    pipe = pipeline("token-classification", model=str(path), aggregation_strategy="simple",
                    device=device)
    pipe(texts[:16], batch_size=16)  # warm up
    candidates = (32,) if opts.quick else _PIPELINE_BATCHES
    rates = {}
    for b in candidates:
        sample = texts[:_SWEEP_SAMPLE]
        t0 = time.perf_counter()
        pipe(sample, batch_size=b)
        rates[b] = len(sample) / (time.perf_counter() - t0)
    chosen = max(rates, key=rates.get)
    loaded = rss_mb()
    start = time.perf_counter()
    out = pipe(texts, batch_size=chosen)
    seconds = time.perf_counter() - start
    found = [[(e["entity_group"], e["start"], e["end"]) for e in ents] for ents in out]
    sweep = ", ".join(f"b{b}={r:.0f}" for b, r in rates.items())
    return SideResult("transformers pipeline", "peer", len(texts),
                      sum(token_lens(path, texts)), seconds, loaded_rss_mb=loaded,
                      note=f"batch {chosen} (sweep texts/s {sweep}); {_entities_digest(found)}",
                      outputs_file=save_json(opts, "ner-pipeline", found))


register(Workload(
    name="ner",
    description="NER (ner-pii-minilm, aggregation simple) on 500 texts with names, emails, "
                "phones and addresses vs the transformers token-classification pipeline",
    metric="throughput",
    sides=lambda opts: pooler_sides(opts, _pooler) + [
        Side("transformers pipeline", "peer", _pipeline)],
    baseline="transformers pipeline", flops_per_token=_flops_per_token,
    skip=lambda opts: shared_skip_reason(MODEL)))
