"""evaluate: judging a trained model as the field does, and showing it.

``metrics`` (Cholec80 conventions), ``segments`` (action segmentation's edit and F1@k),
``validate`` (a model over a split's whole videos, all ranks; what training logs of it),
``evaluation`` (``distseq eval``: the table, ``eval.json``), ``predict`` (new videos,
streamed), ``outputs`` (the per-video CSV), ``plots`` and ``report`` (the pictures of a run);
``command`` holds the eval, predict and report commands.
"""
