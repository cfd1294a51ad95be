"""``Llama.from_pretrained``: a GGUF file of a Hugging Face repository, through
``huggingface_hub`` (its cache, its offline mode, its authentication).

The repository's files matching ``filename`` (a name or a glob pattern, as
llama-cpp-python takes it) are fetched with ``snapshot_download``, which answers from
the local cache when ``HF_HUB_OFFLINE=1`` is set; exactly one file must match.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

__all__ = ["download"]


def download(
    repo_id: str,
    filename: str | None,
    *,
    additional_files: list[str] | None = None,
    local_dir: str | None = None,
    local_dir_use_symlinks: Any = "auto",
    cache_dir: str | None = None,
) -> str:
    """The local path of the one file of ``repo_id`` matching ``filename`` (downloaded,
    with the files matching ``additional_files``, such as a split model's shards)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        raise ImportError(
            "Llama.from_pretrained requires the huggingface-hub package: "
            "pip install huggingface-hub"
        ) from None
    if not filename:
        raise ValueError("from_pretrained needs a filename (a name or a glob pattern)")
    patterns = [filename, *(additional_files or [])]
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                allow_patterns=patterns,
                cache_dir=cache_dir,
                local_dir=local_dir,
            )
        )
    except HFValidationError as e:
        raise ValueError(f"{repo_id!r} is not a Hugging Face repository id: {e}") from None
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    files = [f for f in files if not f.startswith(".")]
    paths = []
    for pattern in patterns:
        matching = [f for f in files if fnmatch.fnmatch(f, pattern)]
        if not matching:
            raise ValueError(
                f"No file found in {repo_id} that match {pattern}\n\nAvailable Files:\n{files}"
            )
        if len(matching) > 1:
            raise ValueError(
                f"Multiple files found in {repo_id} matching {pattern}\n\nAvailable Files:\n{files}"
            )
        paths.append(str(folder / matching[0]))
    _ = local_dir_use_symlinks  # huggingface_hub no longer takes it: files are always copied
    return paths[0]
