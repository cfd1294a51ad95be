raise AssertionError("tp_wrong_api.backend must never be imported")
