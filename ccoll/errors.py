"""Typed errors: every failure a user can cause names what was wrong and what is allowed."""


class CcollError(Exception):
    """Base class of every error ccoll raises on purpose."""


class PolicyError(CcollError, ValueError):
    """A codec spec, policy file or policy rule is invalid (unknown name, bad parameter, mismatch)."""


class CodecError(CcollError, ValueError):
    """A codec cannot encode or decode this input (dtype, size, payload length, unsafe parameter)."""


class KernelError(CcollError, RuntimeError):
    """A kernel could not be built or loaded (nvcc missing, compile error, no CUDA device)."""


class TransportError(CcollError, RuntimeError):
    """A transport cannot move these buffers (unsupported group, mismatched sizes, peer failure)."""
