"""`python -m ccoll.kernels check` (also `make kernels-check`) compiles every kernels/*.cu for sm_80 and
sm_90 with nvcc, so a syntax or type error in GPU code fails CI instead of a user's GPU job."""
import subprocess
import sys

from ccoll import kernels


def test_given_every_kernel_source_when_checking_expect_it_compiles_for_sm80_and_sm90():
    names = kernels.kernel_names()
    assert "quant" in names  # the check must not pass vacuously
    proc = subprocess.run(
        [sys.executable, "-m", "ccoll.kernels", "check"], capture_output=True, text=True, timeout=900,
        cwd=kernels.ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in names:
        assert f"{name}.cu compiles for sm_80, sm_90" in proc.stdout
