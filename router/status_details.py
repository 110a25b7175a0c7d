"""gRPC's rich error model for refusals: a google.rpc.Status in the trailing metadata
(``grpc-status-details-bin``) whose BadRequest names the GenerateRequest field at fault, so a
client reads the field without parsing the message (the HTTP API's ``param`` is its twin)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from protos import generation_pb2 as pb

_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)


def field_path(field: str) -> str:
    """Validation names a SamplingParams field alone (``top_p``); its path in a GenerateRequest
    is under ``sampling.``. The request's own fields (``input``: the prompt's oneof,
    ``request_id``) stay as they are."""
    return f"sampling.{field}" if field in _SAMPLING_FIELDS else field


def bad_request(message: str, field: str) -> grpc.Status:
    """INVALID_ARGUMENT with ``message`` as its details and, in its trailing metadata, a Status
    holding one BadRequest.FieldViolation. The Status repeats the code and the message: a
    client's ``rpc_status.from_call`` refuses one whose code or message differ from the call's."""
    violation = error_details_pb2.BadRequest.FieldViolation(
        field=field_path(field), description=message
    )
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message, details=[detail])
    return rpc_status.to_status(status)
