"""jina-embeddings-v3's task adapters chosen per request (issue 43, item 5): one engine serves
all five (`embed(..., task=...)`, `lora=`), mixed in one step, each equal to an engine with
that adapter merged at load (fp32 <= 1e-5) and to transformers' model with it merged.

A tiny seeded folder in the original XLMRobertaLoRA layout (tests/models/
remote_layout_folders.py), with every adapter drawn at random (linear layers, the word and
token type embeddings), so no adapter equals another."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.params import PoolingParams
from tests.models.remote_layout_folders import (JINA_TASKS, build_jina_remote,
                                                jina_reference_with_adapter)
from tests.models.rotary_folders import build_family, require_family

ATOL = 1e-5
TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat",
         "pooler serves embedding models", "berlin",
         "paris is the capital of france and its largest city by far"]
RANK, ALPHA = 2, 3.0
QUERY_INSTRUCTION = "Represent the query for retrieving evidence documents: "


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    require_family("jina_embeddings_v3")
    folder = tmp_path_factory.mktemp("jina_tasks") / "jina"
    model, base, factors = build_jina_remote(folder, rank=RANK, alpha=ALPHA,
                                             adapt_token_types=True)
    return folder, model, base, factors


@pytest.fixture(scope="module")
def engine(jina):
    return Engine(str(jina[0]), device="cpu")


@pytest.fixture(scope="module")
def merged(jina):
    """task -> the embeddings of TEXTS by an engine with that adapter merged at load."""
    out = {}
    for task in JINA_TASKS:
        ref = Engine(str(jina[0]), device="cpu", hf_overrides={"lora_task": task})
        out[task] = np.stack([o.embedding for o in ref.embed(TEXTS)])
    return out


def _one_step(engine: Engine, texts: list[str], loras: list[str | None]):
    """All texts submitted together, each with its adapter: the outputs, and the number of
    forward steps that computed them."""
    steps = []
    runner = engine.core.model_runner
    execute = runner.execute_model

    def counting(scheduler_output):
        if scheduler_output.scheduled_new_reqs:
            steps.append(len(scheduler_output.scheduled_new_reqs))
        return execute(scheduler_output)

    runner.execute_model = counting
    try:
        processed = engine.processor.process(texts)
        results = engine.run_processed(processed, [
            engine.verify_params(PoolingParams(task="embed", lora=lora)) for lora in loras])
    finally:
        runner.execute_model = execute
    return [r.data.numpy() for r in results], len(steps)


def test_the_engine_lists_the_folders_adapters(engine):
    assert engine.task_adapters == JINA_TASKS
    assert engine.lora_names == JINA_TASKS
    assert not engine.lora_enabled  # no adapter can be loaded by path on this model
    assert engine.task_instructions == {"retrieval.query": QUERY_INSTRUCTION}


def test_each_task_equals_the_adapter_merged_at_load(engine, merged):
    for task in JINA_TASKS:
        got = np.stack([o.embedding for o in engine.embed(TEXTS, lora=task)])
        np.testing.assert_allclose(got, merged[task], atol=ATOL, err_msg=task)
        alone = engine.embed(TEXTS[3], lora=task)[0].embedding  # a one-text step
        np.testing.assert_allclose(alone, merged[task][3], atol=ATOL, err_msg=task)
    # No task: the adapter merged at load (text-matching by default), as before.
    default = np.stack([o.embedding for o in engine.embed(TEXTS)])
    np.testing.assert_allclose(default, merged["text-matching"], atol=ATOL)
    # The adapters differ: a choice that was ignored would fail the checks above.
    assert np.abs(merged["retrieval.query"] - merged["separation"]).max() > 1e-3


def test_all_tasks_in_one_step(engine, merged):
    texts = [t for t in TEXTS for _ in JINA_TASKS]
    loras = [task for _ in TEXTS for task in JINA_TASKS]
    loras[0] = None  # the base (the merged adapter) in the same step
    outputs, steps = _one_step(engine, texts, loras)
    assert steps == 1
    for i, (out, lora) in enumerate(zip(outputs, loras)):
        want = merged[lora or "text-matching"][i // len(JINA_TASKS)]
        np.testing.assert_allclose(out, want, atol=ATOL, err_msg=f"input {i} {lora}")


def test_each_task_equals_transformers_with_it_merged(jina, engine):
    """The parity above, and also with jina's own definition of the merge."""
    from transformers import AutoTokenizer

    folder, model, base, factors = jina
    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    lengths = batch["attention_mask"].sum(1).tolist()
    for task in ("retrieval.passage", "classification"):
        ref = jina_reference_with_adapter(model, base, factors, task, ALPHA, RANK)
        with torch.no_grad():
            hidden = ref(**batch).last_hidden_state
        got = engine.token_embed(TEXTS, normalize=False, lora=task)
        for i, (n, out) in enumerate(zip(lengths, got)):
            np.testing.assert_allclose(out.embeddings, hidden[i, :n].numpy(), atol=ATOL,
                                       err_msg=f"{task} text {i}")


def test_task_keyword_is_jinas_encode(jina, engine, merged):
    """task= picks the adapter and puts the task's instruction first, as jina's
    encode(task=...) does; a prompt of the call's own replaces the instruction."""
    folder = jina[0]
    query = Engine(str(folder), device="cpu", hf_overrides={"lora_task": "retrieval.query"})
    want = np.stack([o.embedding for o in query.embed(TEXTS, prompt=QUERY_INSTRUCTION)])
    got = np.stack([o.embedding for o in engine.embed(TEXTS, task="retrieval.query")])
    np.testing.assert_allclose(got, want, atol=ATOL)
    own = np.stack([o.embedding for o in engine.embed(TEXTS, task="retrieval.query",
                                                       prompt="q: ")])
    np.testing.assert_allclose(
        own, np.stack([o.embedding for o in query.embed(TEXTS, prompt="q: ")]), atol=ATOL)
    # A task with no instruction: the adapter alone.
    got = np.stack([o.embedding for o in engine.embed(TEXTS, task="separation")])
    np.testing.assert_allclose(got, merged["separation"], atol=ATOL)


def test_bad_task_choices_are_clear_errors(engine, tmp_path):
    with pytest.raises(ValueError, match="task='embed' is not one of this model's task "
                                         "adapters"):
        engine.embed("x", task="embed")
    with pytest.raises(ValueError, match="already names the adapter 'separation'"):
        engine.embed("x", task="retrieval.query", lora="separation")
    with pytest.raises(ValueError, match="one of the model's own task adapters"):
        engine.remove_lora("separation")
    with pytest.raises(ValueError, match="create it with lora_modules"):
        engine.add_lora("mine", str(tmp_path))
    build_family(tmp_path / "native", "jina_embeddings_v3")  # transformers' layout: none
    native = Engine(str(tmp_path / "native"), device="cpu")
    assert native.task_adapters == [] and native.lora_names == []
    with pytest.raises(ValueError, match="carries no task adapters"):
        native.embed("x", task="retrieval.query")
