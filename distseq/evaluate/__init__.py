"""evaluate: judging a trained model as the field does, and showing it.

``metrics`` (Cholec80 conventions), ``segments`` (action segmentation's edit and F1@k),
``validate`` (a model over a split's whole videos, all ranks; what training logs of it),
``evaluation`` (``distseq eval``: the table, ``eval.json``), ``scored_files`` (prediction files
against truth files, no model), ``folds`` (k folds' mean and std), ``plots`` and ``report`` (the
pictures of a run); ``command`` holds the eval and report commands. Running a model over new
videos is ``infer``'s.
"""
