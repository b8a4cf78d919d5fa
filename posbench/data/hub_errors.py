"""What a Hugging Face hub failure means, in one line that says what to do.

``transformers`` and ``datasets`` wrap the hub's own exceptions (``huggingface_hub.errors.GatedRepoError``,
``RepositoryNotFoundError``, ...) into ``OSError`` / ``DatasetNotFoundError`` with multi-line messages;
:func:`explain` walks the exception chain (``__cause__`` / ``__context__``) and the message text and returns
one line for the cases a user can act on:

* a gated repository (Llama-2, some data sets): accept the licence on its page, then log in;
* a repository that does not exist or is private: check the name (or log in);
* a missing revision or file;
* no connection / offline mode;
* a data-set *script* repository, which ``datasets`` 4 and later refuse to run.

Anything else returns None and the caller keeps its own wording.
"""

from __future__ import annotations

LOGIN = "log in with `hf auth login` (formerly `huggingface-cli login`) or set HF_TOKEN"


def _chain(exc: BaseException):
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__])


def _classes():
    try:
        from huggingface_hub import errors, utils  # huggingface_hub: only a failed hub call needs it
    except ImportError:       # pragma: no cover - huggingface_hub is a dependency of datasets and transformers
        return {}
    names = ("GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError",
             "RemoteEntryNotFoundError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "DisabledRepoError")
    found = {n: getattr(errors, n, None) for n in names}
    if found["OfflineModeIsEnabled"] is None:
        found["OfflineModeIsEnabled"] = getattr(utils, "OfflineModeIsEnabled", None)
    return {k: v for k, v in found.items() if v is not None}


def kind_of(exc: BaseException) -> str | None:
    """``gated``, ``missing``, ``revision``, ``file``, ``offline``, ``script`` or None."""
    classes = _classes()

    def isa(e, name):
        return name in classes and isinstance(e, classes[name])

    chain = list(_chain(exc))
    for e in chain:                                  # the hub's own types first (the most precise)
        if isa(e, "GatedRepoError"):
            return "gated"
    for e in chain:
        if isa(e, "RevisionNotFoundError"):
            return "revision"
        if isa(e, "DisabledRepoError") or isa(e, "RepositoryNotFoundError"):
            return "missing"
        if isa(e, "OfflineModeIsEnabled") or isa(e, "LocalEntryNotFoundError"):   # a subclass of the next
            return "offline"
        if isa(e, "EntryNotFoundError") or isa(e, "RemoteEntryNotFoundError"):
            return "file"
    for e in chain:                                  # then the wrappers' wording
        text = str(e).lower()
        name = type(e).__name__
        if "dataset scripts are no longer supported" in text:
            return "script"
        if "gated" in text and ("repo" in text or "dataset" in text):
            return "gated"
        if name == "DatasetNotFoundError" or "doesn't exist on the hub" in text \
                or "is not a local folder and is not a valid model identifier" in text \
                or "is not a local folder or a valid repository name" in text:
            return "missing"
        if "is not a valid git identifier" in text or ("revision" in text and "doesn't exist" in text):
            return "revision"
        network_library = type(e).__module__.split(".")[0] in ("httpx", "httpx2", "requests", "urllib3")
        if (isinstance(e, ConnectionError) or "couldn't reach" in text or "couldn't connect" in text
                or (network_library and ("connect" in name.lower() or "timeout" in name.lower()))):
            return "offline"
    return None


def explain(exc: BaseException, name: str, *, repo_type: str = "dataset", offline: str | None = "") -> str | None:
    """One line for a hub failure of ``name`` (a ``repo_type`` ``dataset`` or ``model``), or None. ``offline``:
    what to do without a network (``None``: leave an offline failure to the caller's own wording)."""
    kind = kind_of(exc)
    if kind is None or (kind == "offline" and offline is None):
        return None
    what = "data set" if repo_type == "dataset" else "model"
    repo = name.split(":")[0]
    page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo}"
    if kind == "gated":
        return (f"'{name}' is a gated {what} on the Hugging Face hub: accept its licence at {page} with your "
                f"account, then {LOGIN}")
    if kind == "missing":
        return (f"'{name}' was not found on the Hugging Face hub (or it is private): check the {what}'s name at "
                f"{page}; if it is private, {LOGIN}")
    if kind == "revision":
        return f"the revision asked for does not exist for '{name}' on the Hugging Face hub: check it at {page}"
    if kind == "file":
        return f"a file that '{name}' needs is not in its hub repository: check the name and the revision at {page}"
    if kind == "offline":
        return (f"cannot reach the Hugging Face hub for '{name}' (offline or no network): "
                f"{offline or 'connect, or pass a local copy'}")
    return (f"'{name}' is a {what} script repository, which datasets 4 and later no longer run: use a copy with "
            f"data files (parquet or json) on the hub or pass local files")
