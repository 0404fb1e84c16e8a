"""model: the network, and nothing about how it runs over time or across devices.

``backbone`` (torchvision CNN, norm policy, local weights) -> ``head`` (LSTM/GRU, the carried
state of ordered mode) -> ``video`` (the whole model and ``build_model``); ``norms`` finds the
layers whose running statistics training keeps.
"""
