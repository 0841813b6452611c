"""The one exception type a user should see without a traceback."""


class GrpoError(Exception):
    """Bad input from the user (config, data, paths): printed as one short message, exit 1.

    Anything else is a bug in grpo and keeps its traceback.
    """
