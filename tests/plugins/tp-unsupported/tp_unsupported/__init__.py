"""A GPU backend on a machine without its driver: scores 0 with a reason."""

from tensorplug.registration import Registration


def _score() -> tuple[int, str]:
    return 0, "no FooGPU driver found (tp-unsupported)"


registration = Registration(
    name="FOOGPU", api_version=(1, 0), init="tp_unsupported.backend:create_reg", score=_score
)
