"""The object stores' clients, set once for the process: `configure`, which vit_jax.base
calls when it is first imported, before any module of the package makes a path or opens a
store (etils reads EPATH_USE_TF at the first path on a store, TensorStore and fsspec their
settings when they open one).

etils would route gs:// through TensorFlow's filesystem where TensorFlow is installed, so
that the same run behaved differently on two installs: EPATH_USE_TF=false keeps fsspec
(gcsfs, s3fs) the one backend. Each setting yields to one the user made.
"""

import contextlib
import os


def configure() -> None:
    """Sets the clients' process-wide defaults; a second call changes nothing."""
    os.environ.setdefault("EPATH_USE_TF", "false")  # one backend, TensorFlow or not
    # TensorStore's (Orbax's arrays): under 1 byte/s for a minute is a failure that it
    # retries, not a wait without end (its default: no limit).
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", "60")
    # Listings are not cached: Orbax's arrays (TensorStore) and the other processes of a
    # run write beside this process's gcsfs/s3fs, whose listing cache never expires and
    # would not see them (a checkpoint saved after one was set aside read as missing).
    with contextlib.suppress(ImportError):  # no fsspec: no object store either
        import fsspec.config

        for protocol in ("gcs", "s3"):
            fsspec.config.conf.setdefault(protocol, {}).setdefault("use_listings_cache", False)
        import aiohttp  # gcsfs's: a connection silent for a minute fails (and is retried)

        stalled = aiohttp.ClientTimeout(sock_connect=30, sock_read=60)
        fsspec.config.conf["gcs"].setdefault("requests_timeout", stalled)
