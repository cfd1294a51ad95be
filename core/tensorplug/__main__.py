"""``python -m tensorplug``: the same as the ``tensorplug`` command."""

from .cli import main

raise SystemExit(main())
