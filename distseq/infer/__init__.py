"""infer: a trained model over new videos, after the checkpoint it is loaded from and before
anything judges it.

``predict`` (per-frame phases of videos, frame folders or shards, streamed a chunk at a time),
``features`` (the backbone's per-frame features, once: feature shards or MS-TCN's ``.npy``),
``outputs`` (the per-video predictions CSV, which ``eval`` writes too), ``ribbon`` (the phases
along a video as a picture); ``command`` holds the predict and features commands.
"""
