"""score: how well predictions match the labels, shared by training's validation, ``eval`` and
``predict``, so that none of them reaches into another.

``metrics`` (Cholec80's conventions), ``segments`` (action segmentation's edit and F1@k),
``validate`` (a model over a split's whole videos, all ranks; what training logs of it),
``predictions`` (the per-video predictions CSV that ``predict`` and ``eval`` write), ``ribbon``
(the phases along a video as a picture).
"""
