"""Devices: what this machine has (probe) and where a model pair goes on it (placement)."""
