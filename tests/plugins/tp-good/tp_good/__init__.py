"""TEST backend for the registry tests; the entry point names ``tp_good.registration``."""
