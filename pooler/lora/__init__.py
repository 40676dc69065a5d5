"""LoRA adapters on the native encoders: reading PEFT folders onto a model (adapter.py), the
served set and one step's rows per adapter (manager.py), heads run per adapter (pooling.py),
the task adapters a model folder carries itself (task_adapters.py: jina-embeddings-v3's).
The per-layer math lives in pooler/layers/lora.py."""
