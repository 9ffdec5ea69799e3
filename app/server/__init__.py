"""The engine process's HTTP face: the app and its listeners, request plumbing, one wing per API dialect
(openai/, anthropic/) and the model's owner (runner/)."""
