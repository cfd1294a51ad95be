raise AssertionError("tp_unsupported.backend must never be imported: it scored 0")
