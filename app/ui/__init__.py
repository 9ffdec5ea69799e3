"""Qt widgets and models of the desktop app; they reach the engine only through app.services."""
