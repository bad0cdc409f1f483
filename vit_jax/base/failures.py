"""What kind of failure a store's (or a disk's) error is, read from its type, its errno,
its HTTP status and its words (gcsfs's, s3fs's, aiohttp's, TensorStore's, Orbax's):

  transient(error)   whether it may pass (a store's outage), so that a retry may succeed
  stores_own(error)  whether it is the store's (or disk's), which waiting or access fixes,
                     not a bad path's or a format's
  status_of(error)   the HTTP status it carries, if any
  REASONS            an OS's words for a disk's failure, as TensorStore and Orbax pass them on

`store.explain` turns them into a line with the way out.
"""

import re

REASONS = (
    "No space left on device",
    "Disk quota exceeded",
    "Permission denied",
    "Read-only file system",
    "Input/output error",
)
# An HTTP status in an error's text: after a word that announces one ("HTTP 404", "code
# 401", "status: 403", "Error 503"), or before its reason ("401 Unauthorized"). A bare
# number is not one: "401" in a port (127.0.0.1:40123) or a checkpoint step
# (checkpoints/401) once made a missing bucket read as missing credentials.
_STATUS = re.compile(
    r"(?:\b(?:http|status|code|error)\W{0,3}(\d{3})\b)"
    r"|(?:\b(\d{3}) (?:unauthorized|forbidden|not found|service unavailable)\b)"
)


def status_of(error: BaseException, lowered: str) -> int | None:
    """The HTTP status of a store's error: its `code`/`status` attribute (gcsfs, aiohttp),
    else one its text (`lowered`, lower case) names as a status (`_STATUS`); None without
    one."""
    for name in ("code", "status"):
        value = getattr(error, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    found = _STATUS.search(lowered)
    return int(found[1] or found[2]) if found else None


def transient(error: BaseException) -> bool:
    """Whether a store's failure may pass: a refused or reset connection, a timeout, HTTP
    408, 429 or 5xx. No such object, no permission, no credentials: not."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    text = f"{type(error).__name__}: {error}".lower()
    words = ("connect", "reset", "timed out", "timeout", "unavailable", "broken pipe", "curl")
    if isinstance(error, (ConnectionError, TimeoutError)) or any(w in text for w in words):
        return True  # before a status: 'Recv failure: Unknown error 104' is ECONNRESET
    status = status_of(error, text)
    return status is not None and (status in (408, 429) or status >= 500)


def stores_own(error: BaseException) -> bool:
    """Whether `error` is the store's (or the disk's) own failure: it did not answer, refused
    this account, has no such bucket, or is full, which a rerun outlives once the store
    answers or access is given; not a bad path or a format's limit, which no waiting fixes."""
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    if isinstance(error, OSError) and error.errno or any(r in text for r in REASONS):
        return True
    words = ("credential", "unauthorized", "forbidden", "nosuchbucket", "access denied")
    refused = status_of(error, lowered) in (401, 403, 404) or any(w in lowered for w in words)
    return refused or transient(error) or isinstance(error, (PermissionError, FileNotFoundError))
