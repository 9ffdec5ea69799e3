"""Backends run a model's forward pass; the speculative loop above them is shared."""
