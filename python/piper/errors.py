"""piper's exceptions: one class per kind of C++ Status (src/base/status.h).

Every error the library reports is raised as a subclass of :class:`Error` whose message is the line the CLI
prints after ``piper: error:``; the class says which kind it is (``piper.InvalidArgument`` for a bad strategy,
``piper.NotFound`` for a missing file or preset, ...). Nothing the module does on bad input aborts the
interpreter.
"""


class Error(Exception):
    """Base class of every error the piper library reports. ``code`` is the status name, e.g. "INVALID_ARGUMENT"."""

    code = "UNKNOWN"

    @property
    def message(self):
        return str(self)


class InvalidArgument(Error, ValueError):
    """Bad user input: a model config, a strategy string, a keyword, a directive."""
    code = "INVALID_ARGUMENT"


class NotFound(Error, LookupError):
    """An unknown preset or a missing file."""
    code = "NOT_FOUND"


class OutOfRange(Error, ValueError):
    code = "OUT_OF_RANGE"


class FailedPrecondition(Error):
    """The inputs are valid but cannot be used together (e.g. directives that do not verify)."""
    code = "FAILED_PRECONDITION"


class DataLoss(Error):
    code = "DATA_LOSS"


class DeadlineExceeded(Error):
    code = "DEADLINE_EXCEEDED"


class Unavailable(Error):
    code = "UNAVAILABLE"


class ResourceExhausted(Error):
    """Does not fit in device memory."""
    code = "RESOURCE_EXHAUSTED"


class Unimplemented(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class Internal(Error):
    code = "INTERNAL"


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, OutOfRange, FailedPrecondition, DataLoss,
                                      DeadlineExceeded, Unavailable, ResourceExhausted, Unimplemented, Internal)}


def error_class(code_name):
    """The class for a status code name as src/base/status.cc spells it ("INVALID_ARGUMENT", ...)."""
    return _BY_CODE.get(str(code_name).upper(), Error)
