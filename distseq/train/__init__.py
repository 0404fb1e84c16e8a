"""train: the loop (``loop``, a recipe of named steps) and its parts: ``step``, ``optim``,
``log`` and stop ``signals``; ``command`` is ``distseq train``.

The trainer composes every stage below it; nothing below imports it, so a model can be built,
loaded and run (``predict``, ``eval``, ``bench``) without it.
"""
