"""model: the network, and nothing about how it runs over time or across devices.

``frames`` (the frame contract: uint8 or float, normalisation) -> ``backbone`` (torchvision,
``timm:NAME`` or an import path; norm policy, local weights) -> ``head`` (LSTM/GRU, the head
contract, the carried state of ordered mode), ``tcn`` (MS-TCN, causal too) and ``transformer``
(local attention, causal too) -> ``video`` (the whole model and ``build_model``; the head alone
over stored features). ``imported`` builds factories named by import path; ``norms`` finds the
layers whose running statistics training keeps.
"""
