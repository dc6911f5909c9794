"""The OTLP span receiver: wire formats (decode.py), bounded storage (store.py), the
HTTP/gRPC ingest (receiver.py) and the source the pipeline reads (source.py)."""
