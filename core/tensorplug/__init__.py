"""tensorplug: ggml-backend for Python."""
