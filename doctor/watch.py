"""placeholder, replaced below"""
def watch(*a, **k):  # type: ignore[no-untyped-def]
    raise NotImplementedError
