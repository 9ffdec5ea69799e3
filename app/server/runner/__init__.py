"""The model's owner: the Runner face, the Worker thread in this process, the engine child, the wire."""
