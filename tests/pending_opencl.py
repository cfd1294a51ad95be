"""Conformance cases whose contract changed in the core before the OpenCL kernels caught up.

Each entry names the case and what the kernels still do. The OpenCL conformance test
marks them as strict xfails, so once the kernels are fixed the case passes, the xfail
fails, and the entry must go; tests that put OpenCL under another device (the meta
device) leave them out of their failure lists for the same reason.
"""

from __future__ import annotations

PENDING: dict[str, str] = {}
