"""``python -m tensorplug_cpu.kernels [--markdown | --write [README]]``: the CPU plugin's
``mul_mat`` dispatch table (:mod:`.dispatch`), printed or written into its README.

It lives here rather than under ``-m tensorplug_cpu.kernels.dispatch``: this package
imports :mod:`.dispatch` itself, and runpy warns about running a module that is already
imported."""

from __future__ import annotations

import sys

from .dispatch import main

sys.exit(main())
