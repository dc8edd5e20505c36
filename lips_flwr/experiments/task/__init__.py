"""The examples' learning task, as Flower's app templates keep it in ``task.py``: :mod:`.data` (the
paper's low-data Dirichlet split and dataset loaders), :mod:`.models` (VGG6, ResNet8/10, small CNNs)
and :mod:`.training` (the train and evaluate loops, and the hook through which the batched engine
runs a ClientApp's compute).

The bottom room of the experiments wing: it imports none of ``compare``, ``runner`` or ``batched``.
"""
