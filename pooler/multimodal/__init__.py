"""Media input for image-text models: decode with limits, hash, preprocess, cache.

Base layer (docs/architecture.md): it imports nothing above config-level modules, so the
engine's input side and the worker's encoder cache can both use it.
"""
