"""Provenance: deterministic Parquet, SHA-256 manifests, environment evidence, verify and diff.

A reviewer must be able to re-check every result without rerunning it, so every table goes
through ``parquet.write_table`` (same data, same bytes) and every stage ends with
``manifest.write_manifest``; ``audit`` re-hashes and compares what the manifests recorded.
"""
