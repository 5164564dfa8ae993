"""A stand-in QAIRT SDK for tests: the real one is a license-gated download (see make_sdk.py)."""
