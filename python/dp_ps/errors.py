"""What can end a Python worker, one class per dp-worker exit code
(docs/command-line.md), so that a launcher can treat each outcome as a
Kubernetes Job treats dp-worker's: `exit_code` is the code dp-worker would
have exited with."""

import grpc


class DpError(Exception):
    """Anything that ends train() or a Worker call; exit_code as dp-worker's."""
    exit_code = 1


class WorkerFailure(DpError):
    """A runtime failure (exit 1): dp-ps refused in a way a retry may not fix."""
    exit_code = 1


class JobFailed(DpError):
    """dp-ps ended the job ("the job failed: ..."), exit 1."""
    exit_code = 1


class ConfigError(DpError):
    """The same on every retry (exit 2): a bad argument, a model or data that
    differ from the job's, a wrong token, a file that cannot be used."""
    exit_code = 2


class ModelMismatch(ConfigError):
    """The module's tensors are not the job's (names, shapes, order)."""


class DataMismatch(ConfigError):
    """dp-ps refused the data fingerprint: another worker's data differ."""


class Unauthenticated(ConfigError):
    """No token, or a wrong one (dp-ps --auth_token_file)."""


class Stopped(DpError):
    """Stopped on request before the job's end (exit 3)."""
    exit_code = 3


class PsUnreachable(DpError):
    """No dp-ps answered for retry_for_s (exit 4): down, unreachable, or a
    TLS mismatch, which looks the same from the worker."""
    exit_code = 4


class CannotRunHere(DpError):
    """This machine cannot run the computation asked for, e.g. device="cuda"
    without a usable GPU (exit 5)."""
    exit_code = 5


def coded(message, code):
    """A WorkerFailure carrying gRPC status `code` (e.code), for the callers
    that act on it (ABORTED: re-sync, UNAVAILABLE: retry, ...)."""
    e = WorkerFailure(message)
    e.code = code
    return e


def for_status(code, details, address):
    """The exception for dp-ps's status `code` and message, however it came
    (a call, or the step channel's answer), its code kept (e.code)."""
    if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("the job failed"):
        cls = JobFailed
    elif code == grpc.StatusCode.FAILED_PRECONDITION and "different data" in details:
        cls = DataMismatch
    elif code == grpc.StatusCode.FAILED_PRECONDITION and "different model" in details:
        cls = ModelMismatch
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        cls = Unauthenticated
    elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                  grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DATA_LOSS):
        cls = ConfigError
    else:
        cls = WorkerFailure
    err = cls(f"dp-ps at {address}: {code.name}: {details}")
    err.code = code
    return err
