"""Lesson 02 · The KV cache: everything notebooks/02_kv_cache.ipynb runs."""
