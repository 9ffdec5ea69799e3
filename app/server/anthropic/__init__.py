"""Anthropic's dialect: Messages (Claude Code, the anthropic package) and its token count."""
