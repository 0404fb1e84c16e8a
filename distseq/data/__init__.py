"""data: WebDataset tar shards -> padded, masked batches of long frame sequences, and the frames
of videos and frame folders.

``manifest`` (shards, ``index.json``, member names) -> ``tar`` (reading, cut detection) ->
``decode`` (a sample checked, JPEG) -> ``augment`` -> ``batch`` -> ``train_stream`` /
``val_stream``, run in DataLoader workers by ``loader`` (batches travel in ``sharedmem``
segments). ``sources`` (video files and frame folders as inputs) and ``video`` (their frames,
resampled, resized and JPEG-encoded) are what ``distseq shard`` stores and ``distseq predict``
reads. ``synthetic`` writes the demo's and the tests' shards. Data parallelism reaches this
package only as the (rank, world) and ``Part`` arguments of the two streams. The shard format
stays here, beside what reads it: ``distseq shard`` writes through ``manifest`` and ``tar``,
and the streams, ``predict``, ``eval`` and the planner read through them.
"""
