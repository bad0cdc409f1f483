"""A GCS server on loopback for the tests: gcp-storage-emulator, with the parts of the
GCS JSON API that it leaves out and that the package's clients rely on:

- a media download carries the object's generation in `x-goog-generation` (TensorStore
  reads it back there; without it, Orbax's OCDBT writes fail with "Malformed
  StorageGeneration" once a manifest is rewritten, at ~150 arrays);
- uploads of every type (media, multipart, resumable: the object named in the URL or in
  the body's metadata) and deletes honour `ifGenerationMatch` (412 when the object's
  generation is another; 0: it must not exist), GCS's create-if-absent that the workdir
  lock uses;
- a bucket named `denied-*` answers writes 403, as GCS answers an account that may only
  read;
- a request that stalls times out after 10 s (the server is single-threaded: one cut
  halfway by tests/relay.py would otherwise hold it, and every client after it);
- `moveTo`, which gcsfs tries first for a rename within a bucket (a checkpoint set
  aside); without it gcsfs logs a 501 traceback per file before copying and deleting;
- a resumable upload's session outlives its last chunk: a request to a finished session
  is answered with the object it made (200), as GCS answers for a week, not 404. gcsfs
  sends a chunk whose answer was lost (tests/relay.py's cut) again, and a 404 there
  read as no such object: Orbax's write of `_CHECKPOINT_METADATA` failed the save.

    python tests/gcs_emulator.py PORT BUCKET [DATA_DIR]  # serves until killed; 'ready'

`serve(port, bucket, data_dir)` is the fixtures': the server in a subprocess (its objects
in memory, or in DATA_DIR, where a server started again finds them).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from http import HTTPStatus

DENIED = "denied-"  # buckets of this name refuse writes: 403, as to an account that only reads


def _generation(storage, bucket: str, name: str) -> str:
    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except Exception:  # noqa: BLE001 (the emulator's NotFound)
        return "0"


def _precondition_failed(request, response, storage, bucket: str, name: str | None) -> bool:
    want = request.query.get("ifGenerationMatch")
    if not want or name is None or want[0] == _generation(storage, bucket, name):
        return False
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": "At least one of the pre-conditions "
                             "you specified did not hold."}})  # fmt: skip
    return True


def patch() -> None:
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    # The emulator serves one connection at a time: a request cut halfway (tests/relay.py)
    # would hold it, and every client after it, forever. GCS itself times such a one out.
    server.RequestHandler.timeout = 10
    original = {"download": objects.download, "insert": objects.insert, "delete": objects.delete}
    original["upload_partial"] = objects.upload_partial
    finished: dict[str, dict] = {}  # upload_id: the object its session made

    def download(request, response, storage, *args, **kwargs):
        original["download"](request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            bucket, name = request.params["bucket_name"], request.params["object_id"]
            response["x-goog-generation"] = _generation(storage, bucket, name)
            response["x-goog-metageneration"] = "1"

    def upload_partial(request, response, storage, *args, **kwargs):
        upload_id = request.query["upload_id"][0]
        if upload_id in finished:  # a chunk sent again: GCS answers with the object
            response.json(finished[upload_id])
            return None
        session = storage.resumable.get(upload_id)
        out = original["upload_partial"](request, response, storage, *args, **kwargs)
        if session is not None and upload_id not in storage.resumable:  # this chunk ended it
            finished[upload_id] = storage.get_file_obj(session["bucket"], session["name"])
        return out

    def insert(request, response, storage, *args, **kwargs):
        if (request.query.get("upload_id") or [None])[0] in finished:  # before a precondition
            return upload_partial(request, response, storage, *args, **kwargs)
        if request.params["bucket_name"].startswith(DENIED):  # as GCS answers a reader
            response.status = HTTPStatus.FORBIDDEN
            response.json({"error": {"code": 403, "message": "does not have "
                           "storage.objects.create access to the Google Cloud Storage "
                           "object."}})  # fmt: skip
            return None
        name = (request.query.get("name") or [None])[0]
        if name is None and isinstance(request.data, dict):  # in the body's metadata:
            name = (request.data.get("meta") or request.data).get("name")  # multipart, resumable
        if _precondition_failed(request, response, storage, request.params["bucket_name"], name):
            return None
        return original["insert"](request, response, storage, *args, **kwargs)

    def delete(request, response, storage, *args, **kwargs):
        bucket, name = request.params["bucket_name"], request.params["object_id"]
        if _precondition_failed(request, response, storage, bucket, name):
            return None
        return original["delete"](request, response, storage, *args, **kwargs)

    def move(request, response, storage, *args, **kwargs):
        bucket = request.params["bucket_name"]
        source, dest = request.params["object_id"], request.params["dest_object_id"]
        try:
            moved = objects._copy(request.base_url, storage, bucket, source, bucket, dest)
        except Exception:  # noqa: BLE001 (the emulator's NotFound)
            response.status = HTTPStatus.NOT_FOUND
            return
        storage.delete_file(bucket, source)
        response.json(moved)

    pairs = ((objects.download, download), (objects.insert, insert), (objects.delete, delete))
    pairs += ((objects.upload_partial, upload_partial),)  # a POST with upload_id calls it too
    replace = {id(f): new for f, new in pairs}
    objects.download, objects.insert, objects.delete = download, insert, delete
    objects.upload_partial = upload_partial
    moves = tuple(
        (rf"^{prefix}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
         r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
        for prefix in ("/storage/v1", "")
    )  # fmt: skip
    server.HANDLERS = moves + tuple(
        (regex, {m: replace.get(id(h), h) for m, h in handlers.items()})
        for regex, handlers in server.HANDLERS
    )


def main(port: int, bucket: str, data_dir: str | None = None) -> None:
    import logging

    from gcp_storage_emulator.server import create_server

    logging.disable(logging.CRITICAL)  # the emulator logs every request
    patch()
    kept = {"in_memory": False, "data_dir": data_dir} if data_dir else {"in_memory": True}
    with create_server("127.0.0.1", port, default_bucket=bucket, **kept):
        print("ready", flush=True)
        while True:
            time.sleep(3600)


def env(port: int) -> dict[str, str]:
    """What points gcsfs, google-cloud-storage and TensorStore at the server."""
    url = f"http://127.0.0.1:{port}"
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no gRPC probe of the bucket's type
    }


@contextlib.contextmanager
def clients_at(port: int) -> Iterator[None]:
    """This process's clients (gcsfs, TensorStore) pointed at the server on `port` while
    the block runs: the environment set, then restored; gcsfs's cached instances (of
    another server) dropped before and after."""
    import gcsfs

    saved = {k: os.environ.get(k) for k in env(port)}
    os.environ.update(env(port))
    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gcsfs.GCSFileSystem.clear_instance_cache()


def serve(port: int, bucket: str, data_dir: str | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(port), bucket]
        + ([data_dir] if data_dir else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a client that hangs up mid-reply: a traceback per request
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("the GCS emulator did not start")
    return proc


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:])
