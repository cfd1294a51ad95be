"""A registration module that imports a library that is not installed."""

import tp_missing_gpu_sdk  # noqa: F401  (the point: this raises ModuleNotFoundError)

from tensorplug.registration import Registration

registration = Registration(name="BROKENIMPORT", api_version=(1, 0), init=lambda: None)
