"""Errors the public servicer maps onto gRPC status codes."""


class InvalidRequest(ValueError):
    """Bad input: INVALID_ARGUMENT, with a message saying what is wrong. ``field``: the
    GenerateRequest or SamplingParams field at fault, where one is (the HTTP API gives
    OpenAI's name for it as the error's ``param``); ``input`` for the prompt, whatever its kind.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Overloaded(RuntimeError):
    """The admission queue is full: RESOURCE_EXHAUSTED."""


class DuplicateRequest(RuntimeError):
    """A request with this id is already in flight: ALREADY_EXISTS."""


class ServiceFailure(RuntimeError):
    """A model service failed the request: UNAVAILABLE."""
