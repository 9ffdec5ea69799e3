"""Qt-core glue between the UI and the engine process (process wrapper, HTTP client, jobs)."""
