"""Error text that names the root of a failure, not only its last wrapper.

An agent whose call was reset raises `openai.APIConnectionError: Connection error.`; the reset
(`ConnectionResetError: [Errno 104] Connection reset by peer`) and the address it happened at are
three exceptions down the cause chain, where a user reading one line never looks.
`describe_failure` puts them on that line.
"""

from __future__ import annotations


def cause_chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then what caused it, to the root: the explicit cause (`raise ... from`), else an
    exception it was built from (httpcore wraps anyio's as its argument, and its connection pool
    re-raises `from None`, which cuts the explicit chain), else the implicit context."""
    chain, seen = [exc], {id(exc)}
    while True:
        last = chain[-1]
        nxt = last.__cause__ or next((a for a in last.args if isinstance(a, BaseException)), None)
        if nxt is None and not last.__suppress_context__:
            nxt = last.__context__
        if nxt is None or id(nxt) in seen:
            return chain
        chain.append(nxt)
        seen.add(id(nxt))


def request_address(chain: list[BaseException]) -> str | None:
    """'METHOD URL' of the HTTP request an exception of the chain carries (openai and httpx errors
    keep theirs as `.request`), or None."""
    for exc in chain:
        try:
            request = getattr(exc, "request", None)  # httpx raises RuntimeError when it was never set
        except RuntimeError:
            continue
        url = getattr(request, "url", None)
        if url is not None:
            return f"{getattr(request, 'method', 'request')} {url}"
    return None


def describe_failure(exc: BaseException) -> str:
    """'Type: message', followed, when the chain goes deeper, by its root and the request's address:
    'APIConnectionError: Connection error. (root cause: ConnectionResetError: [Errno 104]
    Connection reset by peer; at POST http://127.0.0.1:40123/v1/chat/completions)'."""
    text = f"{type(exc).__name__}: {exc}"
    chain = cause_chain(exc)
    root, where = chain[-1], request_address(chain)
    extra = []
    if root is not exc:
        extra.append(f"root cause: {type(root).__name__}: {root}")
    if where is not None and where not in text:
        extra.append(f"at {where}")
    return f"{text} ({'; '.join(extra)})" if extra else text
