"""A backend whose score() raises while probing the machine."""

from tensorplug.registration import Registration


def _score() -> int:
    raise OSError("cannot read /dev/tp-broken-score")


registration = Registration(
    name="BROKENSCORE", api_version=(1, 0), init="tp_broken_score.nowhere:create", score=_score
)
