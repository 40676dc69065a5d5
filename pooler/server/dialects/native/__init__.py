"""pooler's own routes, beyond what the peer servers define: /ner, /embed_chunks, BGE-M3's."""
