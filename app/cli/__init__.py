"""The terminal face: the command parser and each command (chat, generate, bench, serve, devices, models)."""
