"""A run's records: SHA-256 manifests, environment evidence, the manifest chain, verify and diff.

A reviewer must be able to re-check every result without rerunning it, so every stage ends with
``manifest.write_manifest`` (its outputs hashed, the manifests it read linked) and ``audit``
re-hashes and compares what the manifests recorded. How bytes are written and digested is
``int8alibi.files``'.
"""
