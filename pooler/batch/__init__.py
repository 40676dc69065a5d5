"""Corpus jobs: read a corpus in chunks, run every row through one Engine, write Parquet part
files that a killed job resumes from (`pooler batch`). Needs pyarrow (`pip install
pooler[batch]`). An entry point: it imports the engine; nothing in the core imports it."""
