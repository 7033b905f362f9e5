"""The storage operations a commit relies on, and their guarantees per store.

Every read and write of the engine goes through one :class:`Storage`, rooted at a table's
location; paths given to it are relative to that location, with ``/`` separators.
``Storage(location, storage_options)`` picks the implementation from the location:

* a plain path or a ``file://`` URI: :class:`LocalStorage` (local or shared file system);
* ``s3://`` (``s3a://``), ``gs://``, ``az://`` / ``abfs://`` / ``abfss://``:
  :class:`ObjectStorage`, through `obstore <https://developmentseed.org/obstore/>`_, the
  Python binding of the Rust ``object_store`` crate that hudi-rs and delta-rs use. It was
  chosen over pyarrow's file systems because its ``put(mode="create")`` is a *conditional*
  create (``If-None-Match: *`` on S3 and Azure, ``x-goog-if-generation-match: 0`` on GCS) and
  ``put(mode={"e_tag": ...})`` a conditional update, the two operations a commit and the
  lock need; pyarrow's S3 file system has neither. Credentials come from the store's usual
  environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, instance metadata) and from
  ``storage_options`` (object_store's keys, the ones hudi-rs takes: ``aws_endpoint_url``,
  ``aws_region``, ``aws_access_key_id``, ``aws_allow_http``, ...), which override it.
  Storage options are never shown: not in ``repr``, logs, errors, commit metadata or
  ``hoodie.properties`` (they are not written anywhere).

Contract (what the write protocol and readers depend on):

* :meth:`Storage.write_new` publishes a whole file under its final name or not at all, and
  fails with :class:`FileExistsError` if the name exists — the completed-instant file is
  published this way, so two writers can never both complete the same instant and a reader
  never sees a half-written commit. On local disk: write a hidden temporary file, fsync,
  then ``link`` it to the final name (atomic, exclusive), then unlink the temporary. On an
  object store: one ``PUT`` with ``If-None-Match: *`` (S3 since 2024-08, GCS, Azure; the
  S3-protocol servers MinIO and moto too).
* **Stores that ignore conditional writes are detected and refused.** Some S3-compatible
  stores (older MinIO, Ceph RGW, appliances) accept ``If-None-Match: *`` and ``If-Match``
  and ignore them: two writers may both "create" a file and the last one wins, so commits
  that both were told succeeded are lost without an error. So before its first write
  (:meth:`write_new`, :meth:`write_new_with`, :meth:`write_replace`) to a store and bucket,
  a process probes it: it creates a unique object under ``.hoodie/.aux/tidelake-probe/`` if
  absent, then again — the second create must answer "exists" (412) — then updates it
  conditionally on an ETag (S3, Azure) or generation (GCS) it does not have — that must
  answer 412 too — and
  removes it (three ``PUT`` requests and a ``DELETE``). The verdict is kept for the
  process's life, per store (scheme, bucket, endpoint settings), and travels with a pickled
  storage to Spark executors; it is not written anywhere durable: it belongs to the
  endpoint, not the table, and a store replaced under a table must be judged anew. A store
  that fails it is refused with :class:`~engine.errors.ConditionalWriteUnsupportedError`,
  which says what the probe saw and names the opt-out
  ``tidelake.storage.allow.unsafe.single.writer`` (``unsafe_single_writer=True``: for a
  table that exactly one process ever writes, as delta-rs's ``AWS_S3_ALLOW_UNSAFE_RENAME``);
  with it, writes go on and one warning is logged per process and store. Reads are never
  probed. Local and mounted file systems are not probed either: exclusive ``link`` is
  enforced by the file system itself.
* **A create that answers "exists" for its own object** is a success: a conditional
  ``PUT`` whose answer was lost is sent again by the client (obstore retries), and the
  retry answers 412 although the first attempt created the object (the trap Hudi's
  storage-based lock documents, RFC-91). Each create carries a unique token as user
  metadata; on "exists", or a failure, the object's token is read (one ``HEAD``): this
  call's token means created by this call, any other is a real conflict
  (:class:`FileExistsError`), none leaves the failure as it was.
* :meth:`Storage.write_replace` publishes a whole file, replacing any previous one
  atomically (local: ``rename``; object store: a plain ``PUT``, atomic per object): used
  for ``hoodie.properties``, heartbeats, consistent-hashing metadata.
* Data files are written through :meth:`Storage.write_new_with`: the producer writes into a
  stream that never carries the final name (local: a hidden ``.tmp.*`` file then published
  by an exclusive link; object store: memory, then one conditional ``PUT``), so a crash
  never leaves a partial file under a data file name; a leftover local temporary file
  starts with ``.tmp.`` and matches no Hudi file pattern, so no reader ever picks it up.
  An object store never shows a partial object at all.
* The lock and heartbeats use the same calls: the lock file is created with
  :meth:`Storage.write_new`, renewed with :meth:`Storage.touch_if` (local: ``utime`` of
  the file just read; object store: a ``PUT`` of the same bytes conditional on the ETag
  read, ``If-Match``), judged by :meth:`Storage.read_with_mtime` (a failed release is
  retried, then left to expire: :mod:`engine.timeline.lock`). Modification times come
  from the store's clock (an object store's ``Last-Modified``, to the second): writers
  need clocks synchronized with the store as they need them with each other.
* Listing: :meth:`Storage.list_dir` is one listing of a prefix with a delimiter on object
  stores (strongly consistent on S3, GCS and Azure); folders do not exist there
  (:meth:`Storage.makedirs` does nothing, an empty "folder" is not listed).
* Durability: a file published with ``fsync=True`` (:meth:`write_new`, the default: timeline
  files, partition metadata; :meth:`write_replace`: ``hoodie.properties``) is
  fsynced before its link or rename, and its folder is fsynced after it, so the new name
  survives a power loss too; a folder created for a file is made durable in its parent.
  Data files written on the committing machine are not flushed one by one: the writer
  calls :meth:`sync` once (Linux ``syncfs`` of the table's file system) after all data
  files of an instant are written and before the completed instant is published. Data
  files written on other machines (Spark executors) are flushed by the task that wrote
  them, each file and its folder entry (``engine.write.write_handle.execute(..., sync=True)``),
  before the task reports them: :meth:`sync` on the driver only reaches the driver's own
  host. A power loss can then lose an uncommitted write, never a committed one. On an
  object store a ``PUT`` is durable when it returns; ``fsync`` and :meth:`sync` do nothing.
* Reads in parts: :meth:`Storage.open_input` with ``whole=False`` on an object store is
  a :class:`RangedInput`: one ``GET`` of the file's tail (its footer, usually), then only the
  ranges a reader asks for, each conditional on the ETag of the first answer, so a file
  replaced meanwhile raises :class:`~engine.errors.FileChangedError` instead of mixing two
  versions (:mod:`engine.storage.ranged`). Locally, ``whole`` changes nothing: pyarrow reads
  what it needs from the file.
* Errors: a missing file raises :class:`FileNotFoundError`, an existing one
  :class:`FileExistsError`; any other failure of an object store raises
  :class:`~engine.errors.StorageError` (transient) naming the operation and the location,
  never a credential.
"""

from engine.storage.base import TEMP_PREFIX, FileStatus, Producer, Storage
from engine.storage.conditional import PROBE_FOLDER
from engine.storage.local import LocalStorage, fsync_folder, make_folders
from engine.storage.locations import (
    OBJECT_SCHEMES,
    STORAGE_OPTION_PREFIXES,
    is_local,
    is_storage_option,
    local_path,
    normalize_location,
    scheme_of,
)
from engine.storage.object_store import ObjectStorage
from engine.storage.ranged import RangedInput

__all__ = [
    "OBJECT_SCHEMES",
    "PROBE_FOLDER",
    "STORAGE_OPTION_PREFIXES",
    "TEMP_PREFIX",
    "FileStatus",
    "LocalStorage",
    "ObjectStorage",
    "Producer",
    "RangedInput",
    "Storage",
    "fsync_folder",
    "is_local",
    "is_storage_option",
    "local_path",
    "make_folders",
    "normalize_location",
    "scheme_of",
]
