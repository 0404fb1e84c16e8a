"""memory: how the model runs over time within a memory budget, without renaming a parameter.

``chunked`` (the backbone in checkpointed chunks, each chunk's ``Hold``: whole, its late stages,
or nothing; BatchNorm statistics kept exact), ``stages`` (where a CNN's stages begin),
``prefetch`` (offloaded frames copied one chunk ahead), ``tbptt`` (truncated BPTT, the baseline
users have today), ``policy`` (``memory.*`` -> the model); for ``memory.budget``: ``probe`` (the
run's model measured), ``plan`` (the least recompute that fits, per T) and ``budget`` (the two
put to work for a run); ``measure`` (saved bytes, peaks and timings of one step).
"""
