"""Drafting: draft sources, the step that drafts with them, the draft-length policy and its estimates."""
