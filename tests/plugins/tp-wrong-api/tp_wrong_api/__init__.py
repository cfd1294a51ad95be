"""A backend written for a future plugin API 2.0: refused before scoring or init."""

from tensorplug.registration import Registration


def _score() -> int:
    raise AssertionError("a plugin refused for its API version must not be scored")


registration = Registration(
    name="WRONGAPI", api_version=(2, 0), init="tp_wrong_api.backend:create_reg", score=_score
)
