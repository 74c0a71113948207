"""The protocol: rejection sampling, filters, committed-prefix bookkeeping, round records, lookups.

No model, no OS access, no threads started (tests/test_structure.py)."""
