"""llama-cpp-python's high-level API on tensorplug: ``Llama`` and the classes around it.

``from tensorplug_llm import Llama`` (or ``import tensorplug_llm as llama_cpp``) gives a
program written for llama-cpp-python what it imports from ``llama_cpp``; the modules
here are named by what they hold, and ``docs/python-api.md`` is their reference.
"""
