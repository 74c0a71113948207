"""Domain errors. Each maps to one gRPC status code in `specdec.runtime.errors`."""


class SpecDecError(Exception):
    """Base class: a request the system refuses, with a message for the client."""


class InvalidArgument(SpecDecError):
    """The request is malformed (bad sampling parameters, bad token ids, γ out of bounds)."""


class OutOfRange(SpecDecError):
    """A position or length lies outside what the session or model can hold."""


class NotFound(SpecDecError):
    """The named session does not exist on this service."""


class AlreadyExists(SpecDecError):
    """A session with this id is already open."""


class FailedPrecondition(SpecDecError):
    """The session is not in a state that allows this request."""


class ResourceExhausted(SpecDecError):
    """The service is at its capacity: its session cap, or the memory a session's KV cache would grow into."""


class Cancelled(SpecDecError):
    """The session ended (its stream cancelled) while one of its rounds still ran: the round stopped."""


class Unavailable(SpecDecError):
    """A downstream service could not be reached."""
