"""JAXLIKE: a backend written from the docs of plugin API 1.0, as an outside author did.

It stands in for a JAX backend (numpy instead of jax, so the tests need no jax): it
declares ``api_version=(1, 0)`` and implements its ops the way the 1.0 docs described
them — numpy broadcasting for binary ops and soft_max masks, IEEE results for relu,
gelu and argmax — and its ``supports_op`` (the 1.0 name of the hook) says yes to them
whatever the shapes. Op contract 1.1 and 1.2 changed those ops; the tests check that
the core never hands it a node it does not understand.
"""

from tensorplug.registration import Registration

registration = Registration(
    name="JAXLIKE", api_version=(1, 0), init="tp_jaxlike.backend:create_reg", score=3
)
