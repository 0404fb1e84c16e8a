"""shard: ``distseq shard``, videos or frame folders plus labels -> WebDataset shards.

``labels`` (phase files, through ``data.label_text``) and ``data.sources`` / ``data.video``
(inputs, their frames) ->
``encode`` (worker processes) -> ``pack`` (crash-safe shards, resume, ``index.json``); ``write``
runs them, ``command`` holds the options. ``released``: MS-TCN's release of an action-segmentation
dataset's features -> feature shards (``distseq shard --released``).
"""
