"""The cheap part: imports nothing from the backend itself (``tp_good.device``)."""

from tensorplug.registration import Registration


def _score() -> tuple[int, str]:
    return 10, "host memory is always there"


registration = Registration(
    name="TEST",
    api_version=(1, 0),
    init="tp_good.device:create_reg",
    score=_score,
    description="registry test backend",
)
