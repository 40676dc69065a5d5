"""What stands between a client and the routes: request limits and token admission
(limits.py, with refusals.py shaping the refusals per dialect), slow and vanished clients
(connection_limits.py), bounded shutdown (shutdown.py), `--api-key` (auth.py) and text that
is not valid Unicode (invalid_text.py)."""
