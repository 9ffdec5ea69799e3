"""The engine core: loads models and decodes speculatively. Never imports Qt or the HTTP layer."""
