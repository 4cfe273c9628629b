"""Exceptions of the runtime layer.

Both pickle with their fields intact, because ranks send them to one another
through MPI.
"""


class HipError(RuntimeError):
    """A HIP (or mapped CUDA driver) call returned an error.

    ``status`` is the platform's numeric code, ``name`` its symbolic name
    (``hipErrorInvalidValue``, ``CUDA_ERROR_INVALID_VALUE``), ``call`` the
    runtime function that failed and ``message`` the runtime's own text.
    """

    def __init__(self, status, name, call, message):
        super().__init__(f"{call} failed: {name} ({status}): {message}")
        self.status = status
        self.name = name
        self.call = call
        self.message = message

    def __reduce__(self):
        return type(self), (self.status, self.name, self.call, self.message)


class RuntimeNotFoundError(RuntimeError):
    """No GPU runtime library could be loaded; the message lists what was tried."""

    def __init__(self, tried):
        super().__init__(
            "pyar found no usable GPU runtime (set PYAR_PLATFORM=hip|cuda to choose one, "
            f"PYAR_HIP_LIBRARY / PYAR_CUDA_LIBRARY to name the library): {tried}")
        self.tried = tried

    def __reduce__(self):
        return type(self), (self.tried,)
