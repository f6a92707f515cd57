"""Places only this user can reach: the exporter's spill directory and the host relay's socket.

The temporary folder is shared by every user of a host. A fixed name there can be taken
first by someone else (spilling blocked), or be a symlink planted to make an exporter
truncate or append to a file of the planter's choosing, and a fixed TCP port can be answered
by any local process. So goodlens keeps its files, and the relay's Unix socket, in a
directory of the user's own: created with mode 0700 and used only if it is a real directory
(not a symlink) owned by this user that nobody else can enter (group/other permissions of
one of goodlens's own directories are removed). Files in it are opened with ``O_NOFOLLOW``
(and ``O_EXCL`` where created).

Candidates, the first usable one wins: ``TMPDIR/goodlens-UID`` (host-local disk),
``$XDG_RUNTIME_DIR/goodlens``, ``~/.cache/goodlens`` (not for sockets: a home directory may
be shared by every host). A directory the user names (``GOODLENS_SPILL_DIR``,
``spill_dir=``) is created if missing and refused if it is a symlink, belongs to someone
else or others may write to it.
"""

from __future__ import annotations

import os
import stat
import tempfile

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(OSError):
    """A path goodlens will not use: a symlink, someone else's, or open to others."""


def _check_dir(path: str, own: bool) -> None:
    """Refuse ``path`` unless it is a real directory of this user that others cannot write
    to; ``own`` (a directory goodlens made for itself): others may not enter it either,
    and extra permissions are removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePath(f"{path} is a symlink; goodlens does not follow it") from None
        raise UnsafePath(f"{path} is not a usable directory: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user "
                             f"(uid {os.geteuid()})")
        if own and st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
        elif st.st_mode & 0o022:
            raise UnsafePath(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    finally:
        os.close(fd)


def ensure_dir(path: str, own: bool = False) -> str:
    """``path`` as a directory safe for goodlens's files (see the module); created (mode
    0700, parents too) when missing. Raises :class:`UnsafePath`."""
    path = os.path.abspath(path)
    try:
        if own:
            os.mkdir(path, 0o700)
        else:
            os.makedirs(path, 0o700, exist_ok=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafePath(f"cannot create {path}: {exc.strerror or exc}") from None
    _check_dir(path, own)
    return path


def _bases(local: bool) -> list[str]:
    out = [os.path.join(tempfile.gettempdir(), f"goodlens-{os.geteuid()}")]
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(run):
        out.append(os.path.join(run, "goodlens"))
    if not local:
        cache = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(cache):
            cache = os.path.join(os.path.expanduser("~"), ".cache")
        if os.path.isabs(cache):
            out.append(os.path.join(cache, "goodlens"))
    return out


def private_dir(sub: str | None = None, local: bool = False) -> str:
    """This user's goodlens directory (``sub`` inside it), the first usable candidate of
    the module's list; ``local``: only host-local ones (for sockets). Raises
    :class:`UnsafePath` naming why each candidate was refused."""
    why = []
    for base in _bases(local):
        try:
            if base.endswith(f"{os.sep}.cache{os.sep}goodlens"):
                ensure_dir(os.path.dirname(base))  # ~/.cache may not exist yet
            ensure_dir(base, own=True)
            return ensure_dir(os.path.join(base, sub), own=True) if sub else base
        except UnsafePath as exc:
            why.append(str(exc))
    raise UnsafePath("no private goodlens directory: " + "; ".join(why))


def spill_dir(setting: str) -> str:
    """The spill directory for an exporter's ``spill_dir`` setting: ``auto`` is
    ``GOODLENS_SPILL_DIR`` when set, else ``spill`` in :func:`private_dir`."""
    if setting == "auto":
        named = os.environ.get("GOODLENS_SPILL_DIR")
        return ensure_dir(named) if named else private_dir("spill")
    return ensure_dir(setting)


def open_private(path: str, flags: int, create: bool = False) -> int:
    """``os.open`` of a regular file of this user, never through a symlink; ``create``
    makes it (mode 0600, ``O_EXCL``) when missing. Raises OSError (ELOOP for a symlink)."""
    fd = -1
    if create:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        except FileExistsError:
            pass
    if fd < 0:
        fd = os.open(path, flags | _NOFOLLOW)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file of this user")
    return fd


def read_private(path: str) -> bytes:
    """The bytes of a regular file of this user (not through a symlink)."""
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def size_of(path: str) -> int:
    """Size of a regular file at ``path`` (not following a symlink); 0 when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def relay_socket(port: int) -> str:
    """Where the host relay for ``port`` listens: ``relay-PORT.sock`` in the host-local
    :func:`private_dir` (raises :class:`UnsafePath` when there is none)."""
    return os.path.join(private_dir(local=True), f"relay-{port}.sock")


def check_socket(path: str) -> None:
    """Refuse ``path`` unless it is a Unix socket of this user (in a directory only this
    user can enter: :func:`relay_socket`'s)."""
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} is not a socket of this user")
    _check_dir(os.path.dirname(path) or ".", own=False)
