"""llama-cpp-python's high-level API on tensorplug: grammars (:mod:`.grammar`), logits
processors and stopping criteria (:mod:`.processors`), chat formats by name
(:mod:`.chat_formats`)."""
