"""evaluate: judging a trained model as the field does: ``metrics`` (Cholec80 conventions),
``validate`` (a model over whole videos, all ranks), and the ``eval`` command."""
