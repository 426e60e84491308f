"""Report files in S3-compatible object storage, through boto3.

Key layout: ``PREFIX/OWNER/SITE/RUN-ID/HOST/SHA256``: the owner (the person's catalog role) first,
so that a site gives each person credentials for their own prefix alone; the object is named by its
content, so a report sent twice is one object, and one already there is never sent again.

Every object is checked against its sha256 as it goes up. A file sent whole carries its SHA-256
(``ChecksumSHA256``), which the server checks against the bytes it received. A multipart upload's
parts each carry their CRC32, which the server checks, and the upload completes only when the whole
file, read once as its parts were sent, has the sha256 the store verified when it brought the report
home; the server's checksum of the parts must then be the one computed here. (CRC32 for the parts,
not SHA-256: S3 has no whole-object SHA-256 for multipart uploads, so a SHA-256 per part would hash
every byte twice, and the parts need only a check against damage in transit.) A part already
uploaded by a cut upload (the client killed, the server restarted) is found again and not sent
twice: an upload resumes.

The client: botocore computes request checksums by default since 1.36, a CRC32 that some
S3-compatible servers reject; fleet sends its own SHA-256 and asks for checksums only
"when_required".
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import zlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from .catalog import TeamError, TeamUnavailable
from .config import ObjectsLocation

PART_SIZE = 64 * 1024 * 1024     # S3 allows 5 MiB to 5 GiB; 64 MiB keeps 10,000 parts above 600 GiB
# parts in flight, each read from the file as it goes: memory stays flat
WORKERS = 8
READ_CHUNK = 1024 * 1024


def _boto3():
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError:
        raise TeamError("the team store needs boto3: pip install 'fleet[team]'") from None
    return boto3, botocore


def client():
    """An S3 client as boto3 configures it (AWS_PROFILE, ~/.aws/credentials, AWS_ENDPOINT_URL), with
    fleet's checksums, path-style addresses (most S3-compatible servers) and bounded waits."""
    boto3, botocore = _boto3()
    config = botocore.config.Config(
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
        s3={"addressing_style": "path"}, connect_timeout=10, read_timeout=120,
        retries={"max_attempts": 4, "mode": "standard"}, max_pool_connections=WORKERS + 2)
    try:
        return boto3.session.Session().client("s3", config=config)
    except botocore.exceptions.BotoCoreError as e:
        raise TeamError(f"the object store cannot be used: {e}") from None


class LazyClient:
    """An S3 client (:func:`client`) made when first used, then kept: a push of many runs makes one
    (boto3 took 0.24 s to make each, loading its service models: 48 of a push's 65 s for 200 runs),
    and a push whose runs are all there already makes none."""

    def __init__(self) -> None:
        self._client = None

    def __getattr__(self, name: str):
        if self._client is None:
            self._client = client()
        return getattr(self._client, name)


def key_of(location: ObjectsLocation, owner: str, site: str, run_id: str, host: str,
           sha256: str) -> str:
    return "/".join((*location.prefix, owner, site, run_id, host, sha256))


def run_prefix(location: ObjectsLocation, owner: str, site: str, run_id: str) -> str:
    return "/".join((*location.prefix, owner, site, run_id)) + "/"


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def failure(e: Exception, what: str) -> TeamError:
    """One line for a failure of S3: unreachable (TeamUnavailable) or refused (TeamError)."""
    _, botocore = _boto3()
    if isinstance(e, botocore.exceptions.ClientError):
        error = e.response["Error"]
        return (TeamError(f"the object store refused {what}: {error.get('Code')} "
                          f"{error.get('Message') or ''}".strip()))
    if isinstance(e, (botocore.exceptions.EndpointConnectionError,
                      botocore.exceptions.ConnectionError, botocore.exceptions.ReadTimeoutError)):
        return TeamUnavailable(f"the object store cannot be reached for {what}: {e}")
    if isinstance(e, botocore.exceptions.NoCredentialsError):
        return TeamError(f"no S3 credentials for {what}: set AWS_PROFILE or ~/.aws/credentials")
    return TeamUnavailable(f"the object store failed {what}: {e}")


@dataclass
class Sent:
    key: str
    size: int
    already_there: bool      # the object was there with this sha256: nothing was sent
    resumed_parts: int = 0   # parts a cut upload had sent, found again and kept


def present(s3, bucket: str, key: str, sha256: str, size: int) -> bool:
    """Whether the object is there, whole, with this content (its size and the
    sha256 it was sent with)."""
    _, botocore = _boto3()
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except botocore.exceptions.ClientError as e:
        if e.response["Error"].get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head["ContentLength"] == size and head.get("Metadata", {}).get("sha256") == sha256


def upload(s3, bucket: str, key: str, path: Path, sha256: str, *, part_size: int = PART_SIZE,
           workers: int = WORKERS) -> Sent:
    """Send one report file (verified: see the module), unless it is there already."""
    size = os.stat(path).st_size
    try:
        if present(s3, bucket, key, sha256, size):
            return Sent(key, size, already_there=True)
        if size <= part_size:
            _put_whole(s3, bucket, key, path, sha256)
            return Sent(key, size, already_there=False)
        return _multipart(s3, bucket, key, path, sha256, size, part_size, workers)
    except TeamError:
        raise
    except Exception as e:  # botocore's and the network's, made one line
        raise failure(e, f"{path.name}") from None


def _put_whole(s3, bucket: str, key: str, path: Path, sha256: str) -> None:
    data = _read_exactly(path, 0, os.stat(path).st_size)
    digest = hashlib.sha256(data).digest()
    if digest.hex() != sha256:
        raise TeamError(f"{path} is no longer the report the store verified (sha256 "
                        f"{digest.hex()[:12]}, not {sha256[:12]}): not sent")
    s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumSHA256=_b64(digest),
                  Metadata={"sha256": sha256})


def _read_exactly(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _existing_upload(s3, bucket: str, key: str, sha256: str) -> tuple[str | None, dict[int, dict]]:
    """A multipart upload of this key and content that a cut left open, and its parts."""
    found = s3.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
    for upload in sorted((u for u in found if u.get("Key") == key), key=lambda u: u.get("Initiated")
                         or 0, reverse=True):
        parts: dict[int, dict] = {}
        pages = s3.get_paginator("list_parts").paginate(Bucket=bucket, Key=key,
                                                        UploadId=upload["UploadId"])
        for page in pages:
            for part in page.get("Parts", []):
                parts[part["PartNumber"]] = part
        return upload["UploadId"], parts
    return None, {}


def _multipart(s3, bucket, key, path, sha256, size, part_size, workers) -> Sent:
    upload_id, had = _existing_upload(s3, bucket, key, sha256)
    if upload_id is None:
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": sha256},
                                               ChecksumAlgorithm="CRC32")["UploadId"]
    whole = hashlib.sha256()
    digests: list[bytes] = []
    done: dict[int, dict] = {}
    resumed = 0
    lock = threading.Lock()

    def send(number: int, offset: int, length: int, crc: bytes) -> None:
        # read again from the page cache, never held whole
        with FileRange(path, offset, length) as body:
            answer = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                    Body=body, ContentLength=length, ChecksumCRC32=_b64(crc))
        with lock:
            done[number] = {"PartNumber": number, "ETag": answer["ETag"],
                            "ChecksumCRC32": _b64(crc)}

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        with ThreadPoolExecutor(workers) as pool:
            pending: set = set()
            for number, offset in enumerate(range(0, size, part_size), start=1):
                length = min(part_size, size - offset)
                crc, md5 = _digest_part(fd, offset, length, whole, with_md5=number in had)
                digests.append(crc)
                if _same_part(had.get(number), length, crc, md5):
                    done[number] = {"PartNumber": number, "ETag": had[number]["ETag"],
                                    "ChecksumCRC32": _b64(crc)}
                    resumed += 1
                    continue
                if len(pending) >= workers:  # memory stays at WORKERS parts, however large the file
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        f.result()
                pending.add(pool.submit(send, number, offset, length, crc))
            for f in pending:
                f.result()
    finally:
        os.close(fd)
    if whole.hexdigest() != sha256:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise TeamError(f"{path} is no longer the report the store verified (sha256 "
                        f"{whole.hexdigest()[:12]}, not {sha256[:12]}): not sent")
    parts = [done[n] for n in sorted(done)]
    answer = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                          MultipartUpload={"Parts": parts})
    _check_composite(answer, digests, key, s3, bucket)
    return Sent(key, size, already_there=False, resumed_parts=resumed)


class FileRange:
    """``length`` bytes of a file from ``offset``, as a file botocore reads a request's body from:
    a part goes up from the file itself, so the memory a part takes is botocore's
    buffer, not the part."""

    def __init__(self, path: Path, offset: int, length: int):
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        self.start, self.length, self.position = offset, length, 0

    def read(self, size: int = -1) -> bytes:
        left = self.length - self.position
        size = left if size is None or size < 0 else min(size, left)
        data = os.pread(self.fd, size, self.start + self.position) if size > 0 else b""
        self.position += len(data)
        return data

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.length}[whence]
        self.position = max(0, min(self.length, base + position))
        return self.position

    def tell(self) -> int:
        return self.position

    def __len__(self) -> int:
        return self.length

    def __enter__(self) -> "FileRange":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _digest_part(fd: int, offset: int, length: int, whole, *,
                 with_md5: bool) -> tuple[bytes, str | None]:
    """A part's CRC32 (and MD5, to recognise it on the server), the whole file's SHA-256 fed on the
    way, read in chunks: the part is never held whole. hashlib and zlib let go
    of the GIL meanwhile."""
    crc, md5 = 0, hashlib.md5(usedforsecurity=False) if with_md5 else None
    for start in range(offset, offset + length, READ_CHUNK):
        chunk = os.pread(fd, min(READ_CHUNK, offset + length - start), start)
        whole.update(chunk)
        crc = zlib.crc32(chunk, crc)
        if md5 is not None:
            md5.update(chunk)
    return crc.to_bytes(4, "big"), md5.hexdigest() if md5 is not None else None


def _same_part(old: dict | None, length: int, crc: bytes, md5: str | None) -> bool:
    """Whether a part a cut upload left on the server holds these bytes: by its CRC32 where the
    server lists one, else by its ETag, which S3 servers make the part's MD5."""
    if old is None or old.get("Size") != length:
        return False
    if old.get("ChecksumCRC32"):
        return old["ChecksumCRC32"] == _b64(crc)
    return md5 is not None and old.get("ETag", "").strip('"') == md5


def _check_composite(answer: dict, digests: list[bytes], key: str, s3, bucket: str) -> None:
    """The server's checksum of the parts must be ours: the CRC32 of the parts' CRC32s, '-N'."""
    expected = f"{_b64(zlib.crc32(b''.join(digests)).to_bytes(4, 'big'))}-{len(digests)}"
    got = answer.get("ChecksumCRC32")
    if got is not None and got != expected:
        s3.delete_object(Bucket=bucket, Key=key)
        raise TeamError(f"the object store holds other bytes than were sent for {key} (checksum "
                        f"{got}, not {expected}): removed, send it again")


def delete(s3, bucket: str, keys: list[str]) -> None:
    try:
        for start in range(0, len(keys), 1000):
            batch = keys[start:start + 1000]
            if batch:
                s3.delete_objects(Bucket=bucket,
                                  Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
    except Exception as e:
        raise failure(e, "the removal") from None


def download(url: str, dest: Path, sha256: str, *, timeout: float = 60) -> int:
    """One object through the address the catalog signed, into ``dest`` (a new file, renamed into
    place only once its sha256 is the catalog's): its size back."""
    import urllib.error
    import urllib.request

    from ...agent import files
    from .. import private

    partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url,
                                    timeout=timeout) as answer, files.open_partial(str(partial),
                                                                                   0) as out:
            while chunk := answer.read(READ_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except urllib.error.HTTPError as e:
        partial.unlink(missing_ok=True)
        raise TeamError(f"the object store refused {dest.name}: HTTP {e.code} {e.reason}") from None
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise TeamUnavailable(f"the object store cannot be reached for {dest.name}: {e}") from None
    if digest.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise TeamError(f"{dest.name} came back with sha256 {digest.hexdigest()[:12]}, not the "
                        f"catalog's {sha256[:12]}: not kept")
    private.rename_into_place(partial, dest)
    return size
