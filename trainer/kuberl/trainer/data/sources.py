"""Remote ``model.path`` and data files: ``hf://`` through the Hugging Face hub cache, ``s3://`` through fsspec.

- ``hf://ORG/NAME[@REVISION]`` (a model) and ``hf://datasets/ORG/NAME[@REVISION]/FILE`` (a data file) go through
  ``huggingface_hub`` and its cache: ``HF_HUB_CACHE`` (or ``HF_HOME``/hub), which on a cluster should be a path on
  a claim mounted in every pod, so a model is fetched once. ``HF_HUB_OFFLINE=1`` is honoured: only the cache is
  read, and a model missing from it is an error that says so.
- ``s3://BUCKET/KEY`` goes through fsspec and s3fs with the usual AWS settings (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for MinIO and other S3-compatible stores). A model prefix is
  copied once into the kuberl cache, keyed by the objects' names, sizes and ETags, so a replaced model is fetched
  again; data files are read into memory on every load, as local ones are.

Which URLs the admission rules accept is decided in ``kuberl.api.rules`` (``MODEL_SOURCE``, ``DATA_SOURCE``);
this module loads exactly those.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF_SCHEME = "hf://"
S3_SCHEME = "s3://"
REMOTE_SCHEMES = (HF_SCHEME, S3_SCHEME)
OFFLINE_VALUES = {"1", "true", "yes", "on"}

_HF_MODEL = re.compile(r"^hf://(?P<repo>[^/@]+/[^/@]+)(?:@(?P<revision>.+))?$")
_HF_DATA = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<revision>[^/]+))?/(?P<file>.+)$")


class SourceError(OSError):
    """A remote source could not be read; the message names the URL and what to check."""


@dataclass(frozen=True)
class HubFile:
    repo: str
    revision: str | None
    file: str | None


def is_remote(path: str) -> bool:
    return path.startswith(REMOTE_SCHEMES)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE``, read at call time (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE_VALUES


def hub_cache() -> str | None:
    """``HF_HUB_CACHE``, else ``HF_HOME``/hub, read at call time; None leaves huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def parse_hf_model(url: str) -> HubFile:
    match = _HF_MODEL.match(url)
    if not match:
        raise SourceError(f"{url!r}: a hub model is hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return HubFile(match["repo"], match["revision"], None)


def parse_hf_data(url: str) -> HubFile:
    match = _HF_DATA.match(url)
    if not match:
        raise SourceError(f"{url!r}: a hub data file is hf://datasets/ORG/NAME/FILE or hf://datasets/ORG/NAME@REV/FILE")
    return HubFile(match["repo"], match["revision"], match["file"])


def _hub_error(url: str, exc: Exception) -> SourceError:
    where = hub_cache() or "the default hub cache (~/.cache/huggingface/hub)"
    if hub_offline():
        return SourceError(
            f"{url}: not in the hub cache {where} and HF_HUB_OFFLINE is set; download it into that cache first "
            f"(huggingface-cli download) or unset HF_HUB_OFFLINE ({type(exc).__name__})"
        )
    return SourceError(f"{url}: cannot fetch from the Hugging Face hub into {where}: {exc}")


def hub_snapshot(url: str, allow_patterns: list[str] | None = None) -> Path:
    """The local snapshot folder of an ``hf://`` model (downloaded into the hub cache unless offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    hub = parse_hf_model(url)
    try:
        folder = snapshot_download(
            hub.repo,
            revision=hub.revision,
            cache_dir=hub_cache(),
            local_files_only=hub_offline(),
            allow_patterns=allow_patterns,
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        raise _hub_error(url, exc) from exc
    return Path(str(folder))


def hub_data_file(url: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    hub = parse_hf_data(url)
    assert hub.file is not None
    try:
        return Path(
            hf_hub_download(
                hub.repo,
                hub.file,
                repo_type="dataset",
                revision=hub.revision,
                cache_dir=hub_cache(),
                local_files_only=hub_offline(),
            )
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        raise _hub_error(url, exc) from exc


def _s3() -> Any:
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SourceError(f"s3:// sources need fsspec and s3fs: pip install s3fs ({exc})") from exc
    try:
        return fsspec.filesystem("s3", skip_instance_cache=True)
    except (ImportError, ValueError) as exc:
        raise SourceError(f"s3:// sources need s3fs: pip install s3fs ({exc})") from exc


def _s3_failure(url: str, exc: Exception) -> SourceError:
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "AWS")
    return SourceError(
        f"{url}: cannot read from S3 ({endpoint}): {type(exc).__name__}: {exc}; check the URL, the credentials "
        "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and AWS_ENDPOINT_URL"
    )


def read_bytes(url: str) -> bytes:
    """The whole content of a remote data file."""
    if url.startswith(HF_SCHEME):
        return hub_data_file(url).read_bytes()
    fs = _s3()
    try:
        data: bytes = fs.cat_file(url)
    except FileNotFoundError as exc:
        raise SourceError(f"{url}: no such object (check data.trainFiles / data.valFiles)") from exc
    except Exception as exc:  # botocore and aiohttp raise many unrelated types; all mean "cannot read"
        raise _s3_failure(url, exc) from exc
    return data


def s3_model(url: str, cache: Path, allow_patterns: list[str] | None = None) -> Path:
    """A local copy of an ``s3://`` model: a folder for a prefix, the file for a single object (a ``.gguf``).

    The copy is written under a temporary name and renamed, so a concurrent loader never reads half of it.
    """
    from fnmatch import fnmatch

    fs = _s3()
    base = url.rstrip("/")[len(S3_SCHEME) :]
    try:
        single = bool(fs.isfile(base))
        objects = {base: fs.info(base)} if single else fs.find(base, detail=True)
    except Exception as exc:  # see read_bytes
        raise _s3_failure(url, exc) from exc
    files = {
        name: info
        for name, info in objects.items()
        if single or allow_patterns is None or any(fnmatch(name[len(base) + 1 :], p) for p in allow_patterns)
    }
    if not files:
        raise SourceError(f"{url}: no objects under this prefix (model.path names a folder of config.json + weights)")
    listing = "\n".join(f"{n}:{i.get('size')}:{i.get('ETag', '')}" for n, i in sorted(files.items()))
    key = hashlib.sha256(f"{base}\n{allow_patterns}\n{listing}".encode()).hexdigest()[:16]
    target = cache / "s3" / key
    name = Path(base).name if single else ""
    if (target / ".complete").exists():
        return target / name if single else target
    staging = target.with_name(f"{key}.tmp-{os.getpid()}")
    try:
        for remote in files:
            relative = Path(base).name if single else remote[len(base) + 1 :]
            local = staging / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(local))
        (staging / ".complete").write_text(url + "\n")
        staging.rename(target)
    except OSError:
        if not (target / ".complete").exists():  # else another process finished the same copy first
            raise
    except Exception as exc:
        raise _s3_failure(url, exc) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / name if single else target


def fetch_model(url: str, cache: Path, allow_patterns: list[str] | None = None) -> Path:
    """A local folder (or ``.gguf`` file) for a remote ``model.path``; ``allow_patterns`` fetches only those files."""
    if url.startswith(HF_SCHEME):
        return hub_snapshot(url, allow_patterns)
    return s3_model(url, cache, allow_patterns)
