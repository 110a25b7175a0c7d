"""Errors the public servicer maps onto gRPC status codes."""


class InvalidRequest(ValueError):
    """Bad input: INVALID_ARGUMENT, with a message saying what is wrong."""


class Overloaded(RuntimeError):
    """The admission queue is full: RESOURCE_EXHAUSTED."""


class DuplicateRequest(RuntimeError):
    """A request with this id is already in flight: ALREADY_EXISTS."""


class ServiceFailure(RuntimeError):
    """A model service failed the request: UNAVAILABLE."""
