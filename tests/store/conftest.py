"""The store fixtures of test_store (both backends) for every test file of the store."""

from test_store import opened, store, url

__all__ = ["opened", "store", "url"]
