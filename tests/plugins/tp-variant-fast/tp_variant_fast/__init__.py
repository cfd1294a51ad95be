"""VARIANT, the fast variant: scores 20 (a CPU plugin would score its SIMD level)."""

from tensorplug.registration import Registration


def _score() -> tuple[int, str]:
    return 20, "fast kernels can run here"


registration = Registration(
    name="VARIANT", api_version=(1, 0), init="tp_variant_fast.backend:create_reg", score=_score
)
