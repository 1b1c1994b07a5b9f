"""`ray.runtime_env`: RuntimeEnv as a dict; Torus applies `env_vars` (and accepts `config`)."""


class RuntimeEnv(dict):
    def __init__(self, *, env_vars=None, config=None, **fields):
        super().__init__()
        if env_vars is not None:
            self["env_vars"] = dict(env_vars)
        if config is not None:
            self["config"] = config
        for k, v in fields.items():
            if v is not None:
                self[k] = v  # refused with NotImplementedError where it is used

    def to_dict(self):
        return dict(self)


class RuntimeEnvConfig(dict):
    def __init__(self, setup_timeout_seconds=600, eager_install=True, log_files=None):
        super().__init__(setup_timeout_seconds=setup_timeout_seconds,
                         eager_install=eager_install)
