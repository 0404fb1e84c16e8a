"""infer: a trained model over new videos, after the checkpoint it is loaded from.

``predict`` (per-frame phases of videos, frame folders or shards, streamed a chunk at a time),
``features`` (the backbone's per-frame features, once: feature shards or MS-TCN's ``.npy``);
``command`` holds the predict and features commands. What predictions are written as, and how
they are scored, is ``score``'s.
"""
