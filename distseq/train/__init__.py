"""train: the loop (``loop``, a recipe of named steps) and its parts: ``step``, ``loss`` (class
weights, MS-TCN's smoothing), ``optim`` (parameter groups, freezing, the schedule), ``log``,
stop ``signals`` and ``warm_start`` (``train.init_from``); ``command`` is ``distseq train``.

The trainer composes every stage below it; nothing below imports it, so a model can be built,
loaded and run (``predict``, ``eval``, ``bench``) without it.
"""
