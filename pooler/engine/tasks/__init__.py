"""Each task family's front door, one module per family: it builds the family's inputs and
`PoolingParams`, runs them through the engine's step loop and shapes the outputs.

`pooler.engine.llm.Engine` owns the model, the step loop and the lifecycle, and attaches these
modules' functions as its task methods (`Engine.embed = embedding.embed`, ...): every function
takes the engine first, through the `TaskEngine` protocol (common.py), so no task module
imports llm.py. A new task is a new module here plus one line per method in `Engine`.

    common.py                 TaskEngine protocol; texts -> processed inputs -> results
    embedding.py              embed (quantized output), token_embed, encode, bi-encoder scores
    chunking.py               long_input="chunk" and late chunking (embed_chunks)
    classification.py         classify, sentence pairs, cross-encoder scores
    token_classification.py   token_classify, ner (token-classification models)
    zero_shot_ner.py          ner with GLiNER span models
    late_interaction.py       ColBERT queries and documents, MaxSim through the query cache
    sparse.py                 SPLADE sparse embeddings (embed_sparse)
    bge_m3.py                 BGE-M3's three outputs and scores
    pairs.py, scoring.py      score / rerank: (query, document) pairs, dispatched per model kind
"""
