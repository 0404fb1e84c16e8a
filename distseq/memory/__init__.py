"""memory: how the model runs over time within a memory budget, without renaming a parameter.

``chunked`` (the backbone in checkpointed chunks, BatchNorm statistics kept exact), ``tbptt``
(truncated BPTT, the baseline users have today) and ``policy`` (``memory.*`` -> the model).
"""
