"""The engine process's HTTP face: listeners, routes, request types and the one model thread."""
