"""data: WebDataset tar shards -> padded, masked batches of long frame sequences.

``format`` (shards, ``index.json``) -> ``tar`` (reading, cut detection) -> ``decode``
(validation, JPEG) -> ``augment`` -> ``batch`` -> ``train_stream`` / ``val_stream``, run in
DataLoader workers by ``loader`` (batches travel in ``sharedmem`` segments). ``synthetic`` writes
the demo's and the tests' shards. Data parallelism reaches this package only as the (rank, world)
arguments of the two streams.
"""
