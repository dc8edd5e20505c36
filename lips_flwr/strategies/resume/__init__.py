"""Checkpoint and resume: the keeper (:mod:`.keeper`), the core's state (:mod:`.core_state`) and
the wrapped chain's state (:mod:`.chain_state`)."""

from .keeper import CheckpointKeeper

__all__ = ["CheckpointKeeper"]
