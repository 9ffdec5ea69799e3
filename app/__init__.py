"""Foresight: fast, private, local AI with speculative decoding."""

__version__ = "0.1.0"
