"""How much of a device one fault-campaign batch may take: the campaign sizes its batches by it and
planning asks the scheduler for that much device memory (a module without torch, for planning)."""

# At most this many layers per batch. 32 was measured on an H200 (qwen3-1.7b, M = 512): no faster
# (campaign 1.11-1.14 s against 0.97-1.10 s with 8) and a 17 GiB peak of device memory (with 8,
# ``bench faults`` peaks at 9.9 GiB, the 196 layers' operands included).
BATCH = 8
# Device memory a batch may take, as a fraction of the device's (``faults.batched.batch_size``).
MEMORY_SHARE = 8
