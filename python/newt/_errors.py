"""newt's exceptions: one per kind of failure of newt.h's results, plus UsageError for a
program that uses this package wrongly (said before anything reaches the library)."""

from . import _capi as C


class Error(Exception):
    """A libnewt call failed. `result` is newt.h's stable name ("timeout", "peer", ...),
    `code` its newt_result_t; the message is libnewt's, naming what failed."""

    def __init__(self, message, code=C.ERR_INTERNAL, result="internal"):
        super().__init__(message)
        self.code = code
        self.result = result


class PeerError(Error):
    """A peer died, hung or left, or a newer plan ended the generation (peer, timeout,
    aborted): the step cannot complete. Inside `with step:` newt recovers from it."""


class UnavailableError(Error):
    """etcd cannot be reached (or refused the credentials)."""


class UsageError(Error, ValueError):
    """The program used newt wrongly: a tensor newt cannot carry, state declared too late,
    memory freed behind newt's back, a call out of order. Never swallowed by `with step:`."""

    def __init__(self, message):
        super().__init__(message, C.ERR_INVALID, "invalid")


_KINDS = {C.ERR_PEER: PeerError, C.ERR_TIMEOUT: PeerError, C.ERR_ABORTED: PeerError,
          C.ERR_UNAVAILABLE: UnavailableError, C.ERR_AUTH: UnavailableError}


def raise_for(lib, r, what):
    """Raises the exception of result r of the call `what` (nothing for NEWT_OK)."""
    if r == C.OK:
        return
    msg = (lib.newt_errmsg() or b"").decode("utf-8", "replace")
    name = (lib.newt_result_name(r) or b"?").decode()
    kind = _KINDS.get(r, Error)
    raise kind(f"{what}: {msg}" if msg else f"{what}: {name}", r, name)
