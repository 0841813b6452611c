"""The one exception type a user should see without a traceback."""


class GrpoError(Exception):
    """Bad input from the user (config, data, paths): printed as one short message, exit 1.

    Anything else is a bug in grpo and keeps its traceback.
    """

    exit_code: int = 1


class MissingExtra(GrpoError):
    """An option needs an optional extra that is not installed: the message names the pip install.

    Exit 2, like a command line asking for something this installation cannot do, so a script can
    tell "install more" from a bad value.
    """

    exit_code = 2
