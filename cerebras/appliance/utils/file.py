"""File utilities."""
import os
import secrets
from pathlib import Path

PathLike = str | os.PathLike


def create_symlink(link: PathLike, target: PathLike, target_is_directory: bool = False) -> Path:
    """Make `link` a symbolic link to `target`, replacing whatever link or file is there.

    `target` is stored as given, so a relative target stays relative to the link's
    directory (how Model Zoo points `latest` at the newest run). The new link is made
    under a temporary name and renamed over `link`, so readers never see it missing.
    Refuses to replace a real directory. Returns `link` as a Path.
    """
    link = Path(link)
    if link.is_dir() and not link.is_symlink():
        raise IsADirectoryError(f"cannot create symlink {link}: a directory is there; "
                                f"remove it or choose another link path")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{secrets.token_hex(4)}.tmp")
    os.symlink(os.fspath(target), tmp, target_is_directory=target_is_directory)
    try:
        os.replace(tmp, link)
    except BaseException:
        os.unlink(tmp)
        raise
    return link


__all__ = ["create_symlink"]
