"""Models for the examples."""

from .small_cnn import DigitsCNN

__all__ = ["DigitsCNN"]
