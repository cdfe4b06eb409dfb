"""ccoll.launch's exit discipline and environments, without a process group: a rank process ends by
running its exit handlers and leaving with its status, before the interpreter's teardown."""
from __future__ import annotations

import subprocess
import sys

from ccoll.launch import free_port, rank_env, run_main

PROGRAM = """
import atexit, sys
atexit.register(lambda: print("exit handler ran", flush=True))
class Teardown:  # runs only if the interpreter is torn down normally
    def __del__(self):
        print("interpreter teardown", flush=True)
keep = Teardown()
from ccoll.launch import exit_process
exit_process(int(sys.argv[1]))
"""


def test_given_a_rank_program_when_exit_process_expect_handlers_run_status_kept_and_no_teardown():
    for status in (0, 3):
        r = subprocess.run([sys.executable, "-c", PROGRAM, str(status)], capture_output=True, text=True, timeout=120)
        assert r.returncode == status, r.stderr
        assert "exit handler ran" in r.stdout and "interpreter teardown" not in r.stdout


def test_given_main_raising_when_run_main_expect_traceback_and_status_1(capsys, monkeypatch):
    codes = []
    monkeypatch.setattr("ccoll.launch.exit_process", codes.append)
    run_main(lambda: 1 / 0)
    run_main(lambda: None)
    run_main(lambda: 4)

    def exits():
        raise SystemExit(2)

    run_main(exits)
    assert codes == [1, 0, 4, 2]
    assert "ZeroDivisionError" in capsys.readouterr().err


def test_given_a_rank_when_building_its_env_expect_torchruns_variables():
    env = rank_env(2, 4, 1234, base={"GLOO_SOCKET_IFNAME": "eth9"}, extra={"X": 1})
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")} \
        == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1234"}
    assert env["GLOO_SOCKET_IFNAME"] == "eth9" and env["X"] == "1"
    assert rank_env(0, 1, 1, base={})["GLOO_SOCKET_IFNAME"] == "lo"
    assert 0 < free_port() < 65536
