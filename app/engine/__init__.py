"""The engine: loads models, decodes speculatively, serves HTTP. Never imports Qt."""
