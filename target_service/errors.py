"""Errors the servicer maps onto gRPC status codes."""


class InvalidStep(ValueError):
    """The step is malformed (bad ids, slots or positions): INVALID_ARGUMENT."""


class UnknownRequest(KeyError):
    """A request id the target holds no state for: NOT_FOUND."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown request"


class OutOfCapacity(RuntimeError):
    """No slot-table row is free: RESOURCE_EXHAUSTED."""
