"""How bytes are written and named: SHA-256 digests of files, trees and canonical JSON, atomic writes,
the deterministic Parquet writer and reader, a stage folder's all-or-nothing transaction, and the code
digests that decide reruns. Foundation: no science and no protocol, so every layer may use it."""
