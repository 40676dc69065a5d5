"""What the server tells its operators: Prometheus metrics (metrics.py, with TEI's and vLLM's
metric names in peer_metrics.py), OpenTelemetry traces (tracing.py) and JSON logs
(json_logs.py). Each learns about a request when its answer has gone out."""
