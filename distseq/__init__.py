"""distseq: end-to-end CNN+RNN training on long frame sequences."""

__version__ = "0.1.0"
