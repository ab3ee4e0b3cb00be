"""The admin CLI's failures, each with the exit code it ends the command with.

    AdminError          1  what was asked cannot be done (bad settings, not persistent, ...)
    ├── NotFound        1  the Topic, BucketNotification or queue does not exist
    └── Unreachable     3  the API server or the queue store could not be used

Argument errors are argparse's: exit code 2. Messages are one line a person can act on and
never carry a credential or an environment variable's value.
"""

from __future__ import annotations

__all__ = ["AdminError", "NotFound", "Unreachable"]


class AdminError(Exception):
    exit_code = 1


class NotFound(AdminError):
    pass


class Unreachable(AdminError):
    exit_code = 3
