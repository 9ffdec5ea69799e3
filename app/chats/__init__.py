"""Conversations: the SQLite store, and moving them in and out of it (export, import, delete all)."""
