"""Typed errors: every failure a user can cause names what was wrong and what is allowed."""


class CcollError(Exception):
    """Base class of every error ccoll raises on purpose."""


class PolicyError(CcollError, ValueError):
    """A codec spec, policy file or policy rule is invalid (unknown name, bad parameter, mismatch)."""


class CodecError(CcollError, ValueError):
    """A codec cannot encode or decode this input (dtype, size, payload length, unsafe parameter)."""


class CodecSpecError(CodecError):
    """A codec spec names no registered codec, or a parameter the codec does not take or a value it refuses
    (``get_codec``, ``codec=``). Not a PolicyError: no policy is involved until a policy file names the spec,
    and there ccoll.policy raises PolicyError naming the rule."""


class KernelError(CcollError, RuntimeError):
    """A kernel could not be built or loaded (nvcc missing, compile error, no CUDA device)."""


class TransportError(CcollError, RuntimeError):
    """A transport cannot move these buffers (unsupported group, mismatched sizes, peer failure)."""


class LaunchError(CcollError, RuntimeError):
    """Rank processes could not be started or did not finish (no mpiexec, a rank failed, a timeout)."""


class BenchError(CcollError, ValueError):
    """A benchmark or tuning tool got a bad command line or environment: printed as one line, exit 2."""


class NetemError(CcollError, RuntimeError):
    """Shaped links cannot be built: bad rate/delay, missing privileges or tools, a failed ip/tc command."""


class UnitsError(CcollError, ValueError):
    """A byte size or link rate is not written in a form ccoll accepts; the message shows the forms."""
