"""What the examples and benchmarks share, not needed to use LIPS in a Flower project.

:mod:`.data` (the paper's low-data Dirichlet split and dataset loaders),
:mod:`.models` (VGG6, ResNet8/10, small CNNs), :mod:`.training` (train and
evaluate loops), :mod:`.results` (atomic JSON results files) and
:mod:`.local_flower` (``flwr run`` on a private local SuperLink, stopped by pid).
"""
