"""data: WebDataset tar shards -> padded, masked batches of long frame sequences, and the frames
of videos and frame folders.

``manifest`` (shards, ``index.json``, member names) -> ``tar`` (reading, cut detection) ->
``decode`` (a sample checked, JPEG) -> ``augment`` -> ``batch`` -> ``train_stream`` /
``val_stream``, run in DataLoader workers by ``loader`` (batches travel in ``sharedmem``
segments). ``sources`` (video files and frame folders as inputs) and ``video`` (their frames,
resampled, resized and JPEG-encoded) are what ``distseq shard`` stores and ``distseq predict``
reads. ``label_text`` reads the field's label files (per-frame layouts, ``mapping.txt``,
``.bundle`` lists) and ``cholec80`` knows Cholec80's phases and standard splits: ``shard`` packs
labels with them and ``eval`` scores prediction files against truth files with them, and this is
the room below both.
``synthetic`` writes the demo's and the tests' shards. Data parallelism reaches this package
only as the (rank, world) and ``Part`` arguments of the two streams. The shard format stays
here, beside what reads it: ``distseq shard`` writes through ``manifest`` and ``tar``, and the
streams, ``predict`` and ``eval`` read through them.
"""
