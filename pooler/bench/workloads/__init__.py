"""One module per workload family; each calls `pooler.bench.registry.register` on import.
Every module in this package is imported by `load_workloads`, so adding a workload is adding a
file here (NER vs the transformers pipeline, ColBERT vs PyLate, cross-encoder, server...)."""
