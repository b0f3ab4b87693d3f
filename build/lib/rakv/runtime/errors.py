"""The one exception type whose message is shown to a user as a one-line error (no traceback)."""


class RakvError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class WeightsUnavailable(RakvError):
    """A model's weights cannot be had here (not cached, hub unreachable, package missing)."""
