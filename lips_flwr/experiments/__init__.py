"""What the examples and benchmarks share, not needed to use LIPS in a Flower project.

:mod:`.task` (the learning task: the paper's low-data Dirichlet split and
dataset loaders, VGG6, ResNet8/10 and small CNNs, the train and evaluate
loops), :mod:`.results` (atomic JSON results files),
:mod:`.local_flower` (process tooling: ``flwr run`` on a private local
SuperLink, stopped by pid), :mod:`.seeding` (seeds for the process-wide
generators), and :mod:`.batched`, the batched simulation engine (a Flower
``Grid`` that runs a round's clients in this process, one after another or
their models stacked).

:mod:`.runner`, the one experiment runner every sweep uses (a run's identity
and provenance in its result file, reuse or refuse, resume, runs in fresh
processes); :mod:`.stats` (the study protocol's paired tests, verdicts and
inertia rule); :mod:`.compare` (``lips-flwr compare``, built on the runner:
the command, the summary and the report).

It needs ``lips-flwr[examples]`` (torch above all): without torch, importing
it raises :class:`~lips_flwr._extras.MissingExtraError`, one line naming the
``pip install``.
"""

from .._extras import require

require("lips_flwr.experiments", ["torch"])
