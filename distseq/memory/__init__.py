"""memory: how the model runs over time within a memory budget, without renaming a parameter.

``chunked`` (the backbone in checkpointed chunks, each kept whole, holding its late stages or
recomputed; BatchNorm statistics kept exact), ``stages`` (where a CNN's stages begin), ``tbptt``
(truncated BPTT, the baseline users have today), ``policy`` (``memory.*`` -> the model),
``plan`` (``memory.budget``: the probe and the plan per T) and ``measure`` (saved bytes, peaks).
"""
