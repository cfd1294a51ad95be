"""GGUF files of Hugging Face repositories, through ``huggingface_hub`` (its cache, its
offline mode, its authentication): for ``Llama.from_pretrained`` and for ``tensorplug
serve -hf``.

:func:`download` is llama-cpp-python's choice: the repository's files matching
``filename`` (a name or a glob pattern) are fetched with ``snapshot_download``, which
answers from the local cache when ``HF_HUB_OFFLINE=1`` is set; exactly one file must
match.

:func:`download_quant` is llama.cpp's ``-hf USER/MODEL[:QUANT]``: the repository's GGUF
file of that quantization (``Q4_K_M`` when none is named, else the first GGUF file),
all its shards when it is split, never a multimodal projector (``mmproj``). The file
list comes from the Hub, or offline from the files the cache holds.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_QUANT", "HubError", "download", "download_quant", "pick_gguf"]

#: the quantization ``-hf`` takes when the repository is named without one (llama.cpp's)
DEFAULT_QUANT = "Q4_K_M"
#: a split model's shard: NAME-00001-of-00003.gguf
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class HubError(ValueError):
    """A repository, file or quantization the Hub (or its cache, offline) does not have;
    the message names what is missing and what there is."""


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


def pick_gguf(files: list[str], quant: str | None) -> list[str]:
    """The files of ``quant`` among a repository's ``files`` (every shard of a split
    model, in order): a GGUF file whose name holds the quantization as a word
    (``-Q4_K_M.gguf``, ``.q8_0.gguf``; any case), else with ``quant`` None the
    default's, else the first GGUF file. Projectors (``mmproj``) are never chosen."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise HubError(f"no GGUF file in the repository (its files: {', '.join(sorted(files))})")

    def of(q: str) -> list[str]:
        word = re.compile(rf"(^|[^a-z0-9]){re.escape(q.lower())}([^a-z0-9]|$)")
        return [f for f in ggufs if word.search(Path(f).name.lower())]

    chosen = of(quant) if quant else (of(DEFAULT_QUANT) or ggufs[:1])
    if not chosen:
        raise HubError(
            f"no GGUF file of quantization {quant} (its GGUF files: {', '.join(ggufs)}): "
            "name one of them with :QUANT or --hf-file"
        )
    first = chosen[0]
    shard = _SHARD.search(first)
    if shard is None:
        return [first]
    stem = first[: shard.start()]
    return [f for f in chosen if f.startswith(stem) and _SHARD.search(f)]


def download_quant(
    spec: str, filename: str | None = None, token: str | None = None, cache_dir: str | None = None
) -> str:
    """The local path of ``-hf USER/MODEL[:QUANT]``'s GGUF file (``filename``:
    ``--hf-file``, that file instead), downloaded into the Hub's cache with every shard
    of a split model; the first shard's path, which names the others."""
    try:
        import huggingface_hub
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        raise HubError(
            "downloading a model needs the huggingface-hub package: pip install "
            "'tensorplug-llm[serve]' (or pip install huggingface-hub)"
        ) from None
    repo, _, quant = spec.partition(":")
    try:
        names = (
            [filename]
            if filename
            else pick_gguf(_repo_files(repo, token, cache_dir), quant or None)
        )
        paths = [
            huggingface_hub.hf_hub_download(repo, name, token=token, cache_dir=cache_dir)
            for name in names
        ]
    except HFValidationError as e:
        raise HubError(f"{repo!r} is not a Hugging Face repository id (USER/MODEL): {e}") from None
    except huggingface_hub.errors.HfHubHTTPError as e:
        raise HubError(f"{spec}: the Hub refused it: {e}") from None
    except (huggingface_hub.errors.LocalEntryNotFoundError, OSError) as e:
        raise HubError(f"{spec}: {e}") from None
    return paths[0]


def _repo_files(repo: str, token: str | None, cache_dir: str | None) -> list[str]:
    """The repository's files: the Hub's list, or offline those the cache holds."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if not huggingface_hub.constants.HF_HUB_OFFLINE:
        try:
            return list(huggingface_hub.list_repo_files(repo, token=token))
        except OfflineModeIsEnabled:
            pass
    try:
        folder = Path(
            huggingface_hub.snapshot_download(repo, cache_dir=cache_dir, local_files_only=True)
        )
    except LocalEntryNotFoundError:
        raise HubError(
            f"{repo}: offline (HF_HUB_OFFLINE), and the Hugging Face cache holds nothing of it"
        ) from None
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
