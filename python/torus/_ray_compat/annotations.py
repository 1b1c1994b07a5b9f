"""`ray.util.annotations`: API-stability decorators (no effect here)."""


def _passthrough(*args, **kwargs):
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


PublicAPI = DeveloperAPI = Deprecated = _passthrough


def RayDeprecationWarning(*a, **k):  # noqa: N802 - Ray's name
    return DeprecationWarning(*a, **k)
