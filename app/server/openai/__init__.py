"""OpenAI's dialect: chat and text completions, the model list, Responses (Codex), logprobs."""
