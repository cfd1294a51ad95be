"""VARIANT, the portable variant: scores 5, loses to tp-variant-fast when both install."""

from tensorplug.registration import Registration

registration = Registration(
    name="VARIANT", api_version=(1, 0), init="tp_variant_basic.backend:create_reg", score=5
)
