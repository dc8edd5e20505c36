"""What the examples and benchmarks share, not needed to use LIPS in a Flower project.

:mod:`.data` (the paper's low-data Dirichlet split and dataset loaders),
:mod:`.models` (VGG6, ResNet8/10, small CNNs), :mod:`.training` (train and
evaluate loops), :mod:`.results` (atomic JSON results files),
:mod:`.local_flower` (``flwr run`` on a private local SuperLink, stopped by pid),
and :mod:`.batched`, the batched simulation engine (a Flower ``Grid`` that
runs a round's clients in this process, one after another or their models
stacked).
"""
