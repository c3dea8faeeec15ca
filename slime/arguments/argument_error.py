"""The error every flag check raises: one message that names the flag(s) and says what to do."""


class ArgumentError(ValueError):
    """A flag combination that cannot run. The message names the flags and the fix."""


def fail(message: str):
    raise ArgumentError(message)
