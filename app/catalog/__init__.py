"""Models: GGUF headers, the models that ship as Python packages, and (later) the curated catalog."""
