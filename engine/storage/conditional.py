"""What an object store's conditional writes are worth, and a create that survives its own
retry (:mod:`engine.storage`, "Stores that ignore conditional writes are detected and refused"
and "A create that answers 'exists' for its own object").

:class:`ConditionalWrites` is the part of :class:`~engine.storage.ObjectStorage` that probes a
store once per process (its verdict kept per store and carried with a pickled storage) and
creates objects with ``If-None-Match: *`` and a token.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from engine.config import SINGLE_WRITER_KEY
from engine.errors import ConditionalWriteUnsupportedError, StorageError
from engine.storage.base import Storage

PROBE_FOLDER = ".hoodie/.aux/tidelake-probe"
"""Where the conditional-write probe of an object store creates (and removes) its object,
below the table's location (Hudi keeps auxiliary files in ``.hoodie/.aux``; readers skip it)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What the conditional-write probe found on one store and bucket."""

    safe: bool
    found: str


_VERDICTS: dict[tuple[str, ...], Verdict] = {}
"""The probe's verdict per store identity, for this process (never written anywhere: a
verdict is the endpoint's, not the table's, and a store can be replaced under a table)."""
_WARNED: set[tuple[str, ...]] = set()
_VERDICT_GUARD = threading.Lock()
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "OBJECT_STORE")
_PUT_TOKEN = "tidelaketoken"
"""User metadata key of a create's token (letters only: valid on S3, GCS and Azure alike)."""
_NO_SUCH_ETAG = '"tidelake-probe-no-such-etag"'
_NO_SUCH_GENERATION = "1"
"""A GCS generation no new object has (GCS numbers generations by microseconds since 1970)."""


class ConditionalWrites(Storage):
    """The conditional-write probe and the token create of an object store's storage; the
    store, its object keys and its errors are the implementation's
    (:class:`~engine.storage.ObjectStorage`)."""

    unsafe_single_writer: bool
    _options: dict[str, str]
    _writable: bool

    @property
    def store(self) -> Any:
        """The obstore store of the table's bucket."""
        raise NotImplementedError

    def _key(self, rel: str) -> str:
        """The object key of ``rel`` (refuses paths leaving the table)."""
        raise NotImplementedError

    def _fail(self, op: str, rel: str, exc: Exception) -> StorageError:
        """The :class:`~engine.errors.StorageError` of a failed request, without credentials."""
        raise NotImplementedError

    def _adopt_verdict(self, verdict: Verdict) -> None:
        """Take the probe's verdict on this store found by another process (the driver's,
        carried to an executor with a pickled storage); a verdict of this process stays."""
        with _VERDICT_GUARD:
            _VERDICTS.setdefault(self._store_identity(), verdict)

    def _known_verdict(self) -> Verdict | None:
        """This process's verdict on this store, None if not probed yet."""
        return _VERDICTS.get(self._store_identity())

    def _store_identity(self) -> tuple[str, ...]:
        """The store and bucket this storage writes to, as far as the probe's verdict goes:
        scheme, bucket (container) and the endpoint settings (never a credential)."""
        parts = urlsplit(self.base_path)
        endpoints = sorted((k.lower(), v) for k, v in self._options.items()
                           if "endpoint" in k.lower())
        env = sorted((k, v) for k, v in os.environ.items()
                     if "ENDPOINT" in k.upper() and k.upper().startswith(_ENV_PREFIXES))
        scheme = parts.scheme.lower()
        return ("s3" if scheme == "s3a" else scheme, parts.netloc, repr(endpoints), repr(env))

    def require_conditional_writes(self) -> None:
        """Refuse to write unless this store enforces conditional writes (probed once per
        process, store and bucket: :meth:`_probe`), or the single-writer opt-out is set (then
        warn once); :class:`~engine.errors.ConditionalWriteUnsupportedError` names what the
        probe found and the opt-out."""
        if self._writable:
            return
        identity = self._store_identity()
        with _VERDICT_GUARD:
            verdict = _VERDICTS.get(identity)
            if verdict is None:
                verdict = _VERDICTS[identity] = self._probe()
            warn = (not verdict.safe and self.unsafe_single_writer
                    and identity not in _WARNED)
            if warn:
                _WARNED.add(identity)
        if not verdict.safe and not self.unsafe_single_writer:
            raise ConditionalWriteUnsupportedError(
                f"{self.base_path}: the store does not enforce conditional writes: "
                f"{verdict.found}. Two writers of a table there could both create the same "
                "completed instant or both hold the table lock, and commits they were told "
                "succeeded would be lost without an error. Use a store that enforces "
                "If-None-Match: * and If-Match (S3, GCS, Azure, MinIO, moto), or, only if "
                "exactly one process ever writes this table (no second job, no offline "
                f"service, no backfill), set {SINGLE_WRITER_KEY}=true (a writer option, or "
                "a storage option)")
        if warn:
            log.warning("%s: the store does not enforce conditional writes (%s); writing on "
                        "because %s=true: this table must have a single writer, as a second "
                        "one could overwrite its commits unseen", self.base_path,
                        verdict.found, SINGLE_WRITER_KEY)
        self._writable = True

    def _probe(self) -> Verdict:
        """Create a unique object if absent, twice: the second create must answer "exists"
        (412); then update it conditionally on an ETag (S3, Azure) or generation (GCS) it
        does not have: that must answer 412 too; then remove it. 3 PUTs and 1 DELETE, once
        per process and store."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        rel = f"{PROBE_FOLDER}/{uuid.uuid4().hex}"
        key, where = self._key(rel), self.full(rel)
        try:
            self._create(rel, b"tidelake conditional-write probe: first create")
            try:
                obstore.put(self.store, key, b"second create", mode="create")
                return Verdict(False, f"a second create-if-absent (If-None-Match: *) of the "
                                       f"probe object {where} succeeded instead of answering "
                                       "412 Precondition Failed: the store ignored the "
                                       "condition")
            except AlreadyExistsError:
                pass
            try:
                # object_store updates on S3 and Azure by ETag (If-Match), on GCS by
                # generation (x-goog-if-generation-match): both given, each takes its own.
                obstore.put(self.store, key, b"update",
                            mode={"e_tag": _NO_SUCH_ETAG, "version": _NO_SUCH_GENERATION})
                return Verdict(False, f"an update of the probe object {where} conditional "
                                       "on an ETag or generation it does not have (If-Match, "
                                       "x-goog-if-generation-match) succeeded instead of "
                                       "answering 412 Precondition Failed: the store ignored "
                                       "the condition")
            except PreconditionError:
                pass
            return Verdict(True, "conditional writes enforced")
        except NotSupportedError as exc:
            return Verdict(False, f"the store refused a conditional write of the probe "
                                   f"object {where} as unsupported "
                                   f"({str(exc).splitlines()[0]})")
        except FileExistsError:
            raise StorageError(f"PUT {where}: the probe object existed before it was "
                               "created") from None
        except Exception as exc:
            raise self._fail("PUT", rel, exc) from None
        finally:
            try:
                obstore.delete(self.store, key)
            except FileNotFoundError:
                pass
            except Exception as exc:  # a leftover in .hoodie/.aux harms nothing
                log.warning("could not remove the probe object %s (%s)", where,
                            self._fail("DELETE", rel, exc))

    def _create(self, rel: str, data: bytes | memoryview) -> None:
        """One ``PUT`` with ``If-None-Match: *`` carrying a unique token (user metadata).

        A retried create can answer 412 although its first attempt succeeded: the answer was
        lost and the client sent the request again (Hudi's storage-based lock documents the
        trap, RFC-91 "conditional write retry handling"); the retry may also fail outright
        (an error, no answer). So an "exists" or a failure is checked: the object there
        carrying this call's token was created by this call — a success; any other object
        is a real conflict (:class:`FileExistsError`); no object: the failure stands. The
        check is sound here because a conditionally created file of a table is never
        overwritten, only removed (the lock's end claims), so its token cannot change under
        the check.
        """
        import obstore
        from obstore.exceptions import AlreadyExistsError

        token = uuid.uuid4().hex
        try:
            obstore.put(self.store, self._key(rel), data, mode="create",
                        attributes={_PUT_TOKEN: token})
            return
        except AlreadyExistsError:
            if self._put_token(rel) != token:
                raise FileExistsError(self.full(rel)) from None
            answer = "answered 'exists'"
        except Exception as exc:
            failure = self._fail("PUT", rel, exc)
            try:
                landed = self._put_token(rel) == token
            except OSError:
                landed = False
            if not landed:
                raise failure from None
            answer = f"failed ({failure})"
        log.info("%s: a create %s for the object it had created itself (its first answer was "
                 "lost and the client retried); taken as created", self.full(rel), answer)

    def _put_token(self, rel: str) -> str | None:
        """The create token of the object at ``rel`` (None: missing, or none recorded)."""
        import obstore

        try:
            result = obstore.get(self.store, self._key(rel), options={"head": True})
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail("HEAD", rel, exc) from None
        return dict(result.attributes).get(_PUT_TOKEN)

