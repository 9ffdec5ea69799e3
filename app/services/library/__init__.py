"""The model library for the window, one module per job: the catalog, the local files, the fit scan, pairing
verdicts, loading a pair into the engine, and the worker threads for disk and header work."""
