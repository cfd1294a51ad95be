"""A backend whose Reg misspells a hook: registering it must fail and say so."""

from tensorplug.registration import Registration

registration = Registration(name="BADHOOK", api_version=(1, 0), init="tp_badhook.reg:create_reg")
