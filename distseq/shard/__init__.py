"""shard: ``distseq shard``, videos or frame folders plus labels -> WebDataset shards.

``sources`` (inputs, labels) -> ``encode`` (worker processes) -> ``pack`` (crash-safe shards,
resume, ``index.json``); ``command`` holds the options and the run.
"""
