"""vLLM's pooling API: routes.py serves it; the other modules are its pieces."""
