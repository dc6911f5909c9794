"""The typed ledger document (/ledger.json): its types (v1.py), the one reader and writer
of its keys (codec.py) and its JSON Schema (schema.py)."""
