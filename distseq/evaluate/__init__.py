"""evaluate: judging a trained model as the field does, and showing it.

``judging`` (``distseq eval``: the table, ``eval.json``), ``scored_files`` (prediction files
against truth files, no model), ``folds`` (k folds' mean and std), ``plots`` and ``report`` (the
pictures of a run); ``command`` holds the eval and report commands. The scores themselves are
``score``'s; running a model over new videos is ``infer``'s.
"""
