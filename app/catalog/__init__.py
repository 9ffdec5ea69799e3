"""Models: GGUF headers, curated pairs and their fit, the local library, packaged models, downloads."""
