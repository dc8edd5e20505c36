"""What the examples and benchmarks share, not needed to use LIPS in a Flower project.

:mod:`.data` (the paper's low-data Dirichlet split and dataset loaders),
:mod:`.models` (VGG6, ResNet8/10, small CNNs), :mod:`.training` (train and
evaluate loops), :mod:`.results` (atomic JSON results files),
:mod:`.local_flower` (process tooling: ``flwr run`` on a private local
SuperLink, stopped by pid), :mod:`.seeding` (seeds for the process-wide
generators), and :mod:`.batched`, the batched simulation engine (a Flower
``Grid`` that runs a round's clients in this process, one after another or
their models stacked).

The one experiment runner, which every sweep uses:
:mod:`.apps` (a Flower App folder: components, run config, digest),
:mod:`.runs` (a run's spec and identity), :mod:`.sweep` (``run_sweep``:
reuse, refuse, stage, resume, run in processes), :mod:`.worker` (one run's
process), :mod:`.observe` (what the runner sees through the Grid),
:mod:`.flwr_runs` (runs under the real ``flwr run``), :mod:`.store` (result
files, staging folders, the sweep lock), :mod:`.provenance` (code identity
and where a run was computed), :mod:`.stats` (the study protocol's paired
tests, verdicts and inertia rule); :mod:`.compare`, :mod:`.compare_report`
and :mod:`.cli` (``lips-flwr compare``).
"""
