"""Background loop: many threads share batches, results stay correct, cancel aborts."""
import threading

import numpy as np
import pytest


@pytest.fixture()
def looping_engine(minilm_path):
    from pooler import Engine
    engine = Engine(str(minilm_path))
    batches = []
    loop = engine.start_background_loop()
    loop.step_listeners.append(lambda n, tokens, secs: batches.append(n))
    yield engine, batches
    engine.shutdown()


def test_concurrent_callers_get_their_own_results(looping_engine, minilm_engine):
    engine, batches = looping_engine
    texts = [f"request {i} " + "word " * (i % 9) for i in range(48)]
    expected = [o.embedding for o in minilm_engine.embed(texts)]
    results, errors = {}, []

    def worker(k):
        try:
            for i in range(k, 48, 8):
                results[i] = engine.embed([texts[i]])[0].embedding
        except Exception as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(np.abs(results[i] - expected[i]).max() <= 1e-5 for i in range(48))
    assert max(batches) > 1  # concurrent callers were batched together


def test_cancel_aborts_queued_work(looping_engine):
    from pooler import PoolingParams
    from pooler.engine.engine_loop import RequestCancelled
    engine, _ = looping_engine
    cancel = threading.Event()
    cancel.set()
    processed = engine.processor.process(["word " * 200] * 64)
    params = [engine.verify_params(PoolingParams(task="embed"))] * 64
    with pytest.raises(RequestCancelled):
        engine.run_processed(processed, params, cancel=cancel)
    engine.embed(["drain"])  # the loop keeps serving afterwards
    assert engine._loop.num_unfinished == 0
    assert not engine.core.scheduler.has_unfinished_requests()
